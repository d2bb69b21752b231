#include "worker/engine/simulated_runner.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace baton {
namespace {

constexpr double kMinSlice = 1e-3;  // seconds

class SimulatedRunner : public ForwardRunner {
 public:
  SimulatedRunner(WorkerProfile profile, const ModelConfig& config,
                  KvCache* cache)
      : profile_(std::move(profile)), config_(config), cache_(cache) {}

  absl::Status Forward(std::span<const ForwardItem> items,
                       std::vector<float>* logits,
                       const LayerDoneFn& on_layer_done) override {
    StepWork work;
    int64_t rows = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const ForwardItem& item = items[i];
      if (item.table == nullptr || item.tokens.empty() ||
          item.start_pos != item.table->num_tokens()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "item ", i, ": start_pos ", item.start_pos,
            " must equal the tokens its cache holds, with tokens to feed"));
      }
      const int64_t n = static_cast<int64_t>(item.tokens.size());
      work.Add(item.start_pos, n);
      rows += item.logits == LogitsMode::kNone   ? 0
              : item.logits == LogitsMode::kLast ? 1
                                                 : n;
    }
    const double seconds =
        work.PrefillPart(profile_) + work.DecodePart(profile_);
    // The layers are released at an even pace, in slices of at least
    // kMinSlice: a sleep per layer would cost a wake-up per layer, and the
    // CPU of dozens of simulated workers sharing a core is what a scale
    // test has least of.
    const int64_t layers = std::max<int64_t>(1, config_.num_layers);
    const int64_t slices = std::clamp<int64_t>(
        static_cast<int64_t>(seconds / kMinSlice), 1, layers);
    int64_t released = 0;
    for (int64_t s = 0; s < slices; ++s) {
      absl::SleepFor(absl::Seconds(seconds / static_cast<double>(slices)));
      const int64_t until = (s + 1) * layers / slices;
      for (; released < until; ++released) {
        if (on_layer_done) on_layer_done(released);
      }
    }
    for (const ForwardItem& item : items) {
      BATON_RETURN_IF_ERROR(cache_->SetNumTokens(
          *item.table,
          item.start_pos + static_cast<int64_t>(item.tokens.size())));
    }
    const int64_t vocab = config_.vocab_size;
    logits->assign(static_cast<size_t>(rows * vocab), 0.0f);
    int64_t row = 0;
    for (const ForwardItem& item : items) {
      const int64_t n = static_cast<int64_t>(item.tokens.size());
      const int64_t first = item.logits == LogitsMode::kAll    ? 0
                            : item.logits == LogitsMode::kLast ? n - 1
                                                               : n;
      for (int64_t j = first; j < n; ++j, ++row) {
        const int32_t token =
            SimulatedToken(item.start_pos + j, item.tokens[j], vocab);
        (*logits)[static_cast<size_t>(row * vocab + token)] = 10.0f;
      }
    }
    return absl::OkStatus();
  }

 private:
  const WorkerProfile profile_;
  const ModelConfig config_;
  KvCache* const cache_;
};

class PacedKvSink : public ForwardingKvSink {
 public:
  PacedKvSink(std::unique_ptr<KvSink> inner, absl::Time finish_at)
      : ForwardingKvSink(std::move(inner)), finish_at_(finish_at) {}
  absl::Status Finish() override {
    absl::SleepFor(finish_at_ - absl::Now());  // no-op when past
    return ForwardingKvSink::Finish();
  }

 private:
  const absl::Time finish_at_;
};

}  // namespace

KvSinkFactory SimulatedTransferSinkFactory(KvSinkFactory inner,
                                           WorkerProfile profile) {
  return
      [inner = std::move(inner), profile = std::move(profile)](
          const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
        const absl::Time opened = absl::Now();
        BATON_ASSIGN_OR_RETURN(std::unique_ptr<KvSink> sink, inner(info));
        const int64_t carried = std::max<int64_t>(
            0, info.num_tokens - info.first_block * info.layout.block_size);
        return std::make_unique<PacedKvSink>(
            std::move(sink),
            opened + absl::Seconds(TransferSeconds(profile, carried)));
      };
}

int32_t SimulatedToken(int64_t position, int32_t last_token,
                       int64_t vocab_size) {
  uint64_t x = static_cast<uint64_t>(position) * 0x9e3779b97f4a7c15ULL ^
               static_cast<uint64_t>(static_cast<uint32_t>(last_token));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  const int64_t low = vocab_size / 4;
  return static_cast<int32_t>(
      low + static_cast<int64_t>(x % static_cast<uint64_t>(vocab_size - low)));
}

ForwardRunnerFactory SimulatedRunnerFactory(WorkerProfile profile) {
  return [profile = std::move(profile)](const ModelWeights* weights,
                                        KvCache* cache, ThreadPool* /*pool*/)
             -> absl::StatusOr<std::unique_ptr<ForwardRunner>> {
    if (weights == nullptr || cache == nullptr) {
      return absl::InvalidArgumentError(
          "simulated runner: weights (for the model's shape) and cache are "
          "required");
    }
    return std::make_unique<SimulatedRunner>(profile, weights->config(), cache);
  };
}

}  // namespace baton
