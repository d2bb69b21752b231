// `baton generate`: runs the engine in-process on one prompt (streaming text)
// or a file of prompts (batched together, one JSON line each). Also the
// pieces the remote mode (cli/remote_generate.h) shares with it, so both
// print the same JSON.
#ifndef BATON_CLI_GENERATE_COMMAND_H_
#define BATON_CLI_GENERATE_COMMAND_H_

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/engine/request.h"
#include "worker/sampler/sampling_params.h"

namespace baton::cli {

struct GenerateOptions {
  std::string model_path;
  std::string prompt;        // one prompt, or
  std::string prompts_file;  // one prompt per line, all submitted at once
  bool raw = false;          // skip the chat template
  bool json = false;         // JSON per request instead of streamed text
  bool show_probs = false;   // per token, the top candidates and probabilities
  SamplingParams sampling;
  EngineOptions engine;
};

// Text (or JSON lines) go to `out`; timings and diagnostics to `err`.
absl::Status RunGenerate(const GenerateOptions& options, std::ostream& out,
                         std::ostream& err);

// --- Shared by the local and the remote mode ------------------------------

// Candidates per token that --show_probs asks for.
inline constexpr int32_t kShowProbsCandidates = 5;

// options.sampling with --show_probs applied.
SamplingParams EffectiveSampling(const GenerateOptions& options);

// The prompts of one run: options.prompt, or the non-empty lines of
// options.prompts_file. InvalidArgument unless exactly one of them is given;
// NotFound if the file cannot be read.
absl::StatusOr<std::vector<std::string>> CollectPrompts(
    const GenerateOptions& options);

// One request's outcome, as `baton generate` reports it.
struct GenerationRecord {
  std::vector<TokenOutput> tokens;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status error;  // set when finish_reason == kError
  int64_t prompt_tokens = 0;
  double ttft_ms = 0.0;
  double decode_tokens_per_s = 0.0;
};

// A token's bytes (for the per-token "piece" field).
using TokenPieceFn = std::function<std::string(int32_t token)>;

// {"token_ids", "text", "finish_reason", "error" (only on error),
//  "prompt_tokens", "ttft_ms", "decode_tokens_per_s"} and, when `logprobs` or
// `show_probs`, "logprobs": one entry per token with "token", "piece" (only
// if `piece` is non-null), "logprob" (if known), "top_logprobs" (when
// `logprobs`) and "probs" (when `show_probs`).
nlohmann::json GenerationJson(const GenerationRecord& record,
                              const TokenPieceFn& piece, bool logprobs,
                              bool show_probs);

// One line of JSON output (no newline); invalid UTF-8 is replaced.
std::string JsonLine(const nlohmann::json& json);

// The stderr summary line (with newline): token counts, finish reason, TTFT
// and decode speed.
std::string GenerationSummary(const GenerationRecord& record);

}  // namespace baton::cli

#endif  // BATON_CLI_GENERATE_COMMAND_H_
