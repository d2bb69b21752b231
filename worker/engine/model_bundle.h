// A loaded model with its tokenizer and chat template, as the CLI commands,
// workers, tests and benchmarks need them.
#ifndef BATON_WORKER_ENGINE_MODEL_BUNDLE_H_
#define BATON_WORKER_ENGINE_MODEL_BUNDLE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "worker/engine/model_weights.h"

namespace baton {

struct ModelBundle {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // unset if the model has none

  // `text` as prompt token ids: the user message through the chat template,
  // or the raw text when `raw` (or when the model has no template).
  std::vector<int32_t> EncodePrompt(const std::string& text, bool raw) const;
};

// Loads weights (GGUF or HF folder), the tokenizer from the same source and
// the chat template when the model declares one Baton knows.
absl::StatusOr<ModelBundle> LoadModelBundle(const std::string& path);

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_MODEL_BUNDLE_H_
