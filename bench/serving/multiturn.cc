#include "bench/serving/multiturn.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/serving/metrics.h"

namespace baton::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double MsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start)
      .count();
}

std::vector<int32_t> RandomIds(std::mt19937_64& rng, int n,
                               const MultiTurnOptions& o) {
  std::uniform_int_distribution<int32_t> id(o.vocab_begin, o.vocab_end - 1);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) t = id(rng);
  return out;
}

// One turn: streams the answer into *answer.
TurnRecord RunTurn(v1::Baton::Stub& stub, const MultiTurnOptions& o,
                   const std::vector<int32_t>& prompt,
                   std::vector<int32_t>* answer) {
  TurnRecord r;
  v1::GenerateRequest request;
  request.set_model(o.model);
  for (int32_t t : prompt) request.mutable_token_ids()->add_token_ids(t);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_max_tokens(o.output_len);
  s->set_temperature(0);
  s->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(
                           static_cast<int64_t>(o.request_timeout_s * 1e3)));
  const SteadyClock::time_point start = SteadyClock::now();
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  v1::GenerateResult result;
  bool has_result = false;
  while (reader->Read(&response)) {
    if (response.token_ids_size() > 0 && r.ttft_ms == 0) {
      r.ttft_ms = MsSince(start);
    }
    answer->insert(answer->end(), response.token_ids().begin(),
                   response.token_ids().end());
    if (response.has_result()) {
      result = response.result();
      has_result = true;
    }
  }
  const grpc::Status status = reader->Finish();
  r.e2e_ms = MsSince(start);
  if (!status.ok()) {
    r.error =
        absl::StrCat("rpc ", status.error_code(), ": ", status.error_message());
  } else if (!has_result) {
    r.error = "stream ended without a result";
  } else if (result.finish_reason() == v1::FINISH_REASON_ERROR) {
    r.error = absl::StrCat("error ", result.error_code(), ": ",
                           result.error_message());
  } else {
    r.ok = true;
    r.prompt_tokens = result.usage().prompt_tokens();
    r.cached_tokens = result.usage().cached_tokens();
    r.completion_tokens = result.usage().completion_tokens();
    r.kv_transfer_bytes = result.timings().kv_transfer_bytes();
    r.prefill_worker = result.prefill_worker().worker_id();
  }
  return r;
}

}  // namespace

absl::Status ValidateMultiTurnOptions(const MultiTurnOptions& o) {
  if (o.conversations < 1 || o.turns < 1 || o.system_len < 0 ||
      o.user_len < 1 || o.output_len < 1 || o.max_concurrency < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "multiturn: --multiturn-conversations, --multiturn-turns, "
        "--multiturn-user-len and --random-output-len must be >= 1, "
        "--multiturn-system-len and --max-concurrency >= 0; got ",
        o.conversations, ", ", o.turns, ", ", o.user_len, ", ", o.output_len,
        ", ", o.system_len, ", ", o.max_concurrency));
  }
  if (o.vocab_begin < 0 || o.vocab_end <= o.vocab_begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-range must be BEGIN:END with 0 <= BEGIN < END, "
                     "got ",
                     o.vocab_begin, ":", o.vocab_end));
  }
  return absl::OkStatus();
}

MultiTurnRun RunMultiTurn(v1::Baton::Stub& stub, const MultiTurnOptions& o) {
  // Every prompt token is drawn up front, so the workload does not depend
  // on scheduling: the system prompt, then each conversation's messages.
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> system = RandomIds(rng, o.system_len, o);
  std::vector<std::vector<std::vector<int32_t>>> users(
      static_cast<size_t>(o.conversations));
  for (auto& conversation : users) {
    for (int t = 0; t < o.turns; ++t) {
      conversation.push_back(RandomIds(rng, o.user_len, o));
    }
  }
  MultiTurnRun run;
  std::mutex mu;
  int next_conversation = 0;
  auto worker = [&] {
    while (true) {
      int c;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next_conversation >= o.conversations) return;
        c = next_conversation++;
      }
      std::vector<int32_t> history = system;
      for (int t = 0; t < o.turns; ++t) {
        if (o.interrupted != nullptr && o.interrupted->load()) return;
        const auto& user =
            users[static_cast<size_t>(c)][static_cast<size_t>(t)];
        history.insert(history.end(), user.begin(), user.end());
        std::vector<int32_t> answer;
        TurnRecord r = RunTurn(stub, o, history, &answer);
        r.conversation = c;
        r.turn = t + 1;
        const bool ok = r.ok;
        {
          std::lock_guard<std::mutex> lock(mu);
          run.turns.push_back(std::move(r));
        }
        if (!ok) break;
        history.insert(history.end(), answer.begin(), answer.end());
      }
    }
  };
  const int threads = o.max_concurrency > 0
                          ? std::min(o.max_concurrency, o.conversations)
                          : o.conversations;
  const SteadyClock::time_point start = SteadyClock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  run.duration_s = MsSince(start) / 1e3;
  run.interrupted = o.interrupted != nullptr && o.interrupted->load();
  return run;
}

nlohmann::json MultiTurnSummary(const MultiTurnRun& run) {
  std::vector<double> ttft_first, ttft_later;
  double prompt_first = 0, prompt_later = 0, cached_first = 0, cached_later = 0,
         kv_first = 0, kv_later = 0;
  int64_t output_tokens = 0;
  int failed = 0;
  for (const TurnRecord& r : run.turns) {
    if (!r.ok) {
      ++failed;
      continue;
    }
    output_tokens += r.completion_tokens;
    const bool first = r.turn == 1;
    (first ? ttft_first : ttft_later).push_back(r.ttft_ms);
    (first ? prompt_first : prompt_later) += r.prompt_tokens;
    (first ? cached_first : cached_later) += r.cached_tokens;
    (first ? kv_first : kv_later) += static_cast<double>(r.kv_transfer_bytes);
  }
  auto group = [](const std::vector<double>& ttft, double prompt, double cached,
                  double kv) {
    const Distribution d = Summarize(ttft, {90});
    const double n = static_cast<double>(ttft.size());
    return nlohmann::json{
        {"turns", ttft.size()},
        {"ttft_ms_p50", d.median},
        {"ttft_ms_p90", d.percentiles.empty() ? 0 : d.percentiles[0].second},
        {"prompt_tokens_mean", n > 0 ? prompt / n : 0},
        {"cached_tokens_mean", n > 0 ? cached / n : 0},
        {"kv_transfer_bytes_mean", n > 0 ? kv / n : 0}};
  };
  return nlohmann::json{
      {"duration_s", run.duration_s},
      {"turns_ok", ttft_first.size() + ttft_later.size()},
      {"turns_failed", failed},
      {"output_tokens_per_s",
       run.duration_s > 0 ? static_cast<double>(output_tokens) / run.duration_s
                          : 0},
      {"first_turns", group(ttft_first, prompt_first, cached_first, kv_first)},
      {"later_turns", group(ttft_later, prompt_later, cached_later, kv_later)}};
}

std::string FormatMultiTurnSummary(const nlohmann::json& s) {
  std::string out = "============ Multi-turn Benchmark Result ============\n";
  absl::StrAppendFormat(&out, "%-40s %.2f\n", "Benchmark duration (s):",
                        s["duration_s"].get<double>());
  absl::StrAppendFormat(&out, "%-40s %d\n",
                        "Turns completed:", s["turns_ok"].get<int>());
  absl::StrAppendFormat(&out, "%-40s %d\n",
                        "Turns failed:", s["turns_failed"].get<int>());
  absl::StrAppendFormat(&out, "%-40s %.2f\n",
                        "Output token throughput (tok/s):",
                        s["output_tokens_per_s"].get<double>());
  for (const char* g : {"first_turns", "later_turns"}) {
    const nlohmann::json& j = s[g];
    absl::StrAppendFormat(
        &out,
        "%s (%d): TTFT p50 %.1f ms, p90 %.1f ms; prompt %.0f tokens, "
        "%.0f cached; KV moved %.0f bytes per turn\n",
        g, j["turns"].get<int>(), j["ttft_ms_p50"].get<double>(),
        j["ttft_ms_p90"].get<double>(), j["prompt_tokens_mean"].get<double>(),
        j["cached_tokens_mean"].get<double>(),
        j["kv_transfer_bytes_mean"].get<double>());
  }
  return out;
}

}  // namespace baton::bench
