#include "worker/engine/model_bundle.h"

#include "common/status_macros.h"

namespace baton {

absl::StatusOr<ModelBundle> LoadModelBundle(const std::string& path) {
  ModelBundle bundle;
  BATON_ASSIGN_OR_RETURN(bundle.weights, ModelWeights::Open(path));
  if (bundle.weights->gguf() != nullptr) {
    BATON_ASSIGN_OR_RETURN(bundle.tokenizer,
                           Tokenizer::FromGguf(*bundle.weights->gguf()));
  } else {
    BATON_ASSIGN_OR_RETURN(
        bundle.tokenizer, Tokenizer::FromHfJson(bundle.weights->hf_directory() +
                                                "/tokenizer.json"));
  }
  auto chat = ChatTemplate::ForTokenizer(*bundle.tokenizer);
  if (chat.ok()) bundle.chat_template = *std::move(chat);
  return bundle;
}

std::vector<int32_t> ModelBundle::EncodePrompt(const std::string& text,
                                               bool raw) const {
  if (raw || !chat_template.has_value()) return tokenizer->Encode(text);
  std::vector<ChatMessage> messages = {{"user", text}};
  std::string rendered =
      chat_template->Apply(messages, /*add_generation_prompt=*/true);
  EncodeOptions options;
  if (chat_template->renders_bos()) options.add_bos = false;
  return tokenizer->Encode(rendered, options);
}

}  // namespace baton
