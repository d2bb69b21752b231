#include "cli/generate_command.h"

#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/model_bundle.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace baton::cli {
namespace {

using Json = nlohmann::json;

// Everything streamed back for one request.
struct Collected {
  std::vector<TokenOutput> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  absl::Status error;
  RequestMetrics metrics;
};

// A token's bytes as a quoted JSON string (invalid UTF-8 replaced).
std::string QuotedPiece(const Tokenizer& tokenizer, int32_t token) {
  return Json(tokenizer.TokenToBytes(token))
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json ToJson(const Collected& c, const Tokenizer& tokenizer, bool logprobs,
            bool show_probs) {
  Json j;
  std::vector<int32_t> ids;
  for (const TokenOutput& t : c.tokens) ids.push_back(t.token);
  j["token_ids"] = ids;
  j["text"] = c.text;
  j["finish_reason"] = std::string(FinishReasonName(c.reason));
  if (!c.error.ok()) j["error"] = std::string(c.error.message());
  j["prompt_tokens"] = c.metrics.prompt_tokens;
  j["ttft_ms"] = c.metrics.ttft_s() * 1e3;
  j["decode_tokens_per_s"] = c.metrics.decode_tokens_per_s();
  if (logprobs || show_probs) {
    Json per_token = Json::array();
    for (const TokenOutput& t : c.tokens) {
      Json e;
      e["token"] = t.token;
      e["piece"] = tokenizer.TokenToBytes(t.token);
      if (t.logprob) e["logprob"] = *t.logprob;
      if (logprobs) {
        Json top = Json::array();
        for (const TokenLogprob& a : t.top_logprobs) {
          top.push_back({{"token", a.token}, {"logprob", a.logprob}});
        }
        e["top_logprobs"] = top;
      }
      if (show_probs) {
        Json probs = Json::array();
        for (const TokenProb& p : t.processed) {
          probs.push_back({{"token", p.token}, {"prob", p.prob}});
        }
        e["probs"] = probs;
      }
      per_token.push_back(e);
    }
    j["logprobs"] = per_token;
  }
  return j;
}

absl::StatusOr<std::vector<std::string>> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("cannot read --prompts_file '", path, "'"));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts_file '", path, "' has no prompts"));
  }
  return prompts;
}

// One line per generated token: the token drawn and the distribution it was
// drawn from (after temperature and filtering).
void PrintProbs(const Tokenizer& tokenizer, const TokenOutput& t,
                std::ostream& out) {
  out << absl::StrFormat("%-20s", QuotedPiece(tokenizer, t.token));
  for (const TokenProb& p : t.processed) {
    out << absl::StrFormat("  %s %.4f", QuotedPiece(tokenizer, p.token),
                           p.prob);
  }
  out << "\n";
}

}  // namespace

absl::Status RunGenerate(const GenerateOptions& options, std::ostream& out,
                         std::ostream& err) {
  if (options.model_path.empty())
    return absl::InvalidArgumentError("--model is required");
  if (options.prompt.empty() == options.prompts_file.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt and --prompts_file");
  }
  std::vector<std::string> prompts;
  if (!options.prompts_file.empty()) {
    BATON_ASSIGN_OR_RETURN(prompts, ReadPrompts(options.prompts_file));
  } else {
    prompts.push_back(options.prompt);
  }
  const bool json = options.json || !options.prompts_file.empty();
  BATON_ASSIGN_OR_RETURN(ModelBundle bundle,
                         LoadModelBundle(options.model_path));
  BATON_ASSIGN_OR_RETURN(auto engine,
                         Engine::Create(options.engine, bundle.weights.get(),
                                        bundle.tokenizer.get()));
  SamplingParams sampling = options.sampling;
  if (options.show_probs) sampling.show_probs = 5;

  std::vector<Collected> results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = bundle.EncodePrompt(prompts[i], options.raw);
    Collected* c = &results[i];
    const bool stream = !json;
    absl::Status status = engine->Submit(
        {absl::StrCat("prompt-", i), std::move(ids), sampling},
        [c, stream, &out, &bundle, &options](const RequestOutput& o) {
          for (const TokenOutput& t : o.tokens) {
            c->tokens.push_back(t);
            if (stream && options.show_probs)
              PrintProbs(*bundle.tokenizer, t, out);
          }
          c->text += o.text;
          if (stream && !options.show_probs) out << o.text << std::flush;
          if (o.finish_reason != FinishReason::kNone) {
            c->reason = o.finish_reason;
            c->error = o.error;
            c->metrics = o.metrics;
          }
        });
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("prompt ", i + 1, ": ",
                                                      status.message()));
    }
  }
  engine->RunUntilIdle();

  if (!json) {
    const Collected& c = results[0];
    out << "\n";
    if (!c.error.ok()) return c.error;
    err << absl::StrFormat(
        "[%d prompt tokens, %d generated, finish: %s] TTFT %.1f ms, decode "
        "%.1f tokens/s\n",
        c.metrics.prompt_tokens, c.tokens.size(), FinishReasonName(c.reason),
        c.metrics.ttft_s() * 1e3, c.metrics.decode_tokens_per_s());
    return absl::OkStatus();
  }
  for (const Collected& c : results) {
    out << ToJson(c, *bundle.tokenizer, sampling.logprobs.has_value(),
                  options.show_probs)
               .dump(-1, ' ', false, Json::error_handler_t::replace)
        << "\n";
  }
  return absl::OkStatus();
}

}  // namespace baton::cli
