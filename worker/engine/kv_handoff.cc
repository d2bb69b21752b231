#include "worker/engine/kv_handoff.h"

#include <memory>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"

namespace baton {
namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

KvPoolAddress KvPoolAddress::Host(const KvCache& cache) {
  return Device(cache, cache.pool_data());
}

KvPoolAddress KvPoolAddress::Device(const KvCache& cache, const uint8_t* pool) {
  return KvPoolAddress{
      .base = pool,
      .layer_stride =
          static_cast<uint64_t>(cache.num_blocks_total()) * cache.chunk_bytes(),
      .chunk_bytes = cache.chunk_bytes()};
}

KvHandoff::KvHandoff(KvPoolAddress pool, KvSinkInfo info,
                     std::vector<int32_t> block_ids, KvSinkFactory make_sink,
                     std::function<void()> on_done)
    : pool_(pool),
      info_(std::move(info)),
      block_ids_(std::move(block_ids)),
      make_sink_(std::move(make_sink)),
      on_done_(std::move(on_done)),
      start_(Clock::now()) {
  thread_ = std::thread([this] { Run(); });
}

KvHandoff::~KvHandoff() {
  Abort(absl::CancelledError(
      absl::StrCat("KV handoff of '", info_.request_id, "' abandoned")));
  thread_.join();
}

void KvHandoff::LayerReady(int64_t layer) {
  absl::MutexLock lock(&mu_);
  if (layer + 1 > layers_ready_) layers_ready_ = layer + 1;
  last_ready_ = Clock::now();
}

void KvHandoff::Abort(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  if (!done_ && abort_.ok()) abort_ = std::move(reason);
}

void KvHandoff::Detach(absl::Status reason) {
  Abort(std::move(reason));
  absl::MutexLock lock(&pool_mu_);
  detached_ = true;
}

bool KvHandoff::PoolGate::Enter() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  handoff_->pool_mu_.Lock();
  if (handoff_->detached_) {
    handoff_->pool_mu_.Unlock();
    return false;
  }
  return true;
}

void KvHandoff::PoolGate::Exit() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  handoff_->pool_mu_.Unlock();
}

bool KvHandoff::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

KvHandoffResult KvHandoff::result() const {
  absl::MutexLock lock(&mu_);
  return result_;
}

void KvHandoff::Run() {
  const int64_t num_layers = info_.layout.num_layers;
  const uint64_t chunk = pool_.chunk_bytes;
  std::vector<std::span<const uint8_t>> chunks(block_ids_.size());
  absl::Status status;
  std::unique_ptr<KvSink> sink;
  {
    absl::StatusOr<std::unique_ptr<KvSink>> opened = make_sink_(info_);
    if (opened.ok()) {
      sink = std::move(*opened);
    } else {
      status = opened.status();
    }
  }
  // The blocks the destination holds already leave with no layer.
  size_t skip = 0;
  if (sink != nullptr) {
    const int64_t held = sink->leading_blocks_held();
    if (held < 0 || held >= static_cast<int64_t>(block_ids_.size())) {
      status = absl::InternalError(absl::StrCat("the KV sink holds ", held,
                                                " leading blocks of ",
                                                block_ids_.size(), " sent"));
    } else {
      skip = static_cast<size_t>(held);
    }
  }
  const std::span<const std::span<const uint8_t>> sent =
      std::span<const std::span<const uint8_t>>(chunks).subspan(skip);
  uint64_t bytes = 0;
  for (int64_t layer = 0; status.ok() && layer < num_layers; ++layer) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, layer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return layers_ready_ > layer || !abort_.ok();
      };
      mu_.Await(absl::Condition(&ready));
      if (!abort_.ok()) {
        status = abort_;
        break;
      }
    }
    // Addresses only; the bytes are read under gate_ by the sink.
    for (size_t i = 0; i < block_ids_.size(); ++i) {
      chunks[i] = {pool_.Chunk(layer, block_ids_[i]), chunk};
    }
    status = sink->SendLayerChunks(layer, sent, gate_);
    bytes += sent.size() * chunk;
    if (status.ok()) status = FaultPoints::Global().Hit(kFaultKvLayerSent);
  }
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    if (!abort_.ok()) status = abort_;
  }
  if (status.ok()) {
    status = sink->Finish();
  } else if (sink != nullptr) {
    sink->Abort(status);
  }
  bool detached;
  {
    absl::MutexLock lock(&pool_mu_);
    detached = detached_;
  }
  {
    absl::MutexLock lock(&mu_);
    // Detached meanwhile: the abort reason, not what the revoked gate or a
    // late confirmation said.
    if (!abort_.ok() && (status.ok() || detached)) status = abort_;
    const Clock::time_point now = Clock::now();
    result_.status = status;
    result_.metrics.kv_bytes = bytes;
    result_.metrics.transfer_s = Seconds(now - start_);
    result_.metrics.tail_s =
        last_ready_ == Clock::time_point{} ? 0.0 : Seconds(now - last_ready_);
    done_ = true;
  }
  if (on_done_) on_done_();
}

}  // namespace baton
