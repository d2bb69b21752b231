#include "cli/generate_command.h"

#include <fstream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/engine/model_bundle.h"

namespace baton::cli {
namespace {

using Json = nlohmann::json;

// A token's bytes as a quoted JSON string (invalid UTF-8 replaced).
std::string QuotedPiece(const Tokenizer& tokenizer, int32_t token) {
  return Json(tokenizer.TokenToBytes(token))
      .dump(-1, ' ', false, Json::error_handler_t::replace);
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

SamplingParams EffectiveSampling(const GenerateOptions& options) {
  SamplingParams sampling = options.sampling;
  if (options.show_probs) sampling.show_probs = kShowProbsCandidates;
  return sampling;
}

absl::StatusOr<std::vector<std::string>> CollectPrompts(
    const GenerateOptions& options) {
  if (options.prompt.empty() == options.prompts_file.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt and --prompts_file");
  }
  if (!options.prompts_file.empty()) return ReadPrompts(options.prompts_file);
  return std::vector<std::string>{options.prompt};
}

Json GenerationJson(const GenerationRecord& record, const TokenPieceFn& piece,
                    bool logprobs, bool show_probs) {
  Json j;
  std::vector<int32_t> ids;
  for (const TokenOutput& t : record.tokens) ids.push_back(t.token);
  j["token_ids"] = ids;
  j["text"] = record.text;
  j["finish_reason"] = std::string(FinishReasonName(record.finish_reason));
  if (!record.error.ok()) j["error"] = std::string(record.error.message());
  j["prompt_tokens"] = record.prompt_tokens;
  j["ttft_ms"] = record.ttft_ms;
  j["decode_tokens_per_s"] = record.decode_tokens_per_s;
  if (logprobs || show_probs) {
    Json per_token = Json::array();
    for (const TokenOutput& t : record.tokens) {
      Json e;
      e["token"] = t.token;
      if (piece) e["piece"] = piece(t.token);
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

std::string JsonLine(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string GenerationSummary(const GenerationRecord& record) {
  return absl::StrFormat(
      "[%d prompt tokens, %d generated, finish: %s] TTFT %.1f ms, decode "
      "%.1f tokens/s\n",
      record.prompt_tokens, record.tokens.size(),
      FinishReasonName(record.finish_reason), record.ttft_ms,
      record.decode_tokens_per_s);
}

absl::Status RunGenerate(const GenerateOptions& options, std::ostream& out,
                         std::ostream& err) {
  if (options.model_path.empty())
    return absl::InvalidArgumentError("--model is required");
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> prompts,
                         CollectPrompts(options));
  const bool json = options.json || !options.prompts_file.empty();
  BATON_ASSIGN_OR_RETURN(ModelBundle bundle,
                         LoadModelBundle(options.model_path));
  BATON_ASSIGN_OR_RETURN(auto engine,
                         Engine::Create(options.engine, bundle.weights.get(),
                                        bundle.tokenizer.get()));
  const SamplingParams sampling = EffectiveSampling(options);

  std::vector<GenerationRecord> results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = bundle.EncodePrompt(prompts[i], options.raw);
    GenerationRecord* c = &results[i];
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
            c->finish_reason = o.finish_reason;
            c->error = o.error;
            c->prompt_tokens = o.metrics.prompt_tokens;
            c->ttft_ms = o.metrics.ttft_s() * 1e3;
            c->decode_tokens_per_s = o.metrics.decode_tokens_per_s();
          }
        });
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("prompt ", i + 1, ": ",
                                                      status.message()));
    }
  }
  engine->RunUntilIdle();

  if (!json) {
    const GenerationRecord& c = results[0];
    out << "\n";
    if (!c.error.ok()) return c.error;
    err << GenerationSummary(c);
    return absl::OkStatus();
  }
  const Tokenizer& tokenizer = *bundle.tokenizer;
  const TokenPieceFn piece = [&tokenizer](int32_t token) {
    return tokenizer.TokenToBytes(token);
  };
  for (const GenerationRecord& c : results) {
    out << JsonLine(GenerationJson(c, piece, sampling.logprobs.has_value(),
                                   options.show_probs))
        << "\n";
  }
  return absl::OkStatus();
}

}  // namespace baton::cli
