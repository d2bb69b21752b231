#include "coordinator/service/served_model.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/gguf/gguf_file.h"

namespace baton::coordinator {

absl::StatusOr<std::unique_ptr<ServedModel>> ServedModel::Load(
    const std::string& path) {
  std::unique_ptr<ServedModel> model(new ServedModel());
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    BATON_ASSIGN_OR_RETURN(model->config_,
                           ModelConfigFromHfConfigFile(path + "/config.json"));
    BATON_ASSIGN_OR_RETURN(model->tokenizer_,
                           Tokenizer::FromHfJson(path + "/tokenizer.json"));
  } else {
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf,
                           GgufFile::Open(path));
    BATON_ASSIGN_OR_RETURN(model->config_, ModelConfigFromGguf(*gguf));
    BATON_ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::FromGguf(*gguf));
  }
  model->id_ = !model->config_.name.empty()
                   ? model->config_.name
                   : std::filesystem::path(path).stem().string();
  auto chat = ChatTemplate::ForTokenizer(*model->tokenizer_);
  if (chat.ok()) model->chat_template_ = *std::move(chat);
  return model;
}

absl::StatusOr<std::vector<int32_t>> ServedModel::EncodeText(
    const std::string& text, const std::string& field) const {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": empty text"));
  }
  std::vector<int32_t> ids = tokenizer_->Encode(text);
  if (ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the text encodes to no tokens"));
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> ServedModel::EncodeChat(
    const v1::ChatConversation& chat, const std::string& field) const {
  if (!chat_template_.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": model '", id_,
                     "' has no chat template Baton knows; send text"));
  }
  if (chat.messages().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".messages: at least one message is required"));
  }
  std::vector<ChatMessage> messages;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".messages[", i, "].role: '", m.role(),
                       "' is not one of system, user, assistant"));
    }
    messages.push_back({m.role(), m.content()});
  }
  const std::string rendered =
      chat_template_->Apply(messages, /*add_generation_prompt=*/true);
  EncodeOptions options;
  if (chat_template_->renders_bos()) options.add_bos = false;
  return tokenizer_->Encode(rendered, options);
}

absl::StatusOr<std::vector<int32_t>> ServedModel::EncodePrompt(
    const v1::GenerateRequest& request) const {
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      return EncodeText(request.text(), "text");
    case v1::GenerateRequest::kChat:
      return EncodeChat(request.chat(), "chat");
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().token_ids();
      if (ids.empty()) {
        return absl::InvalidArgumentError(
            "token_ids.token_ids: at least one id is required");
      }
      for (int i = 0; i < ids.size(); ++i) {
        if (!tokenizer_->IsValidId(ids[i])) {
          return absl::InvalidArgumentError(
              absl::StrCat("token_ids.token_ids[", i, "]: ", ids[i],
                           " is outside [0, ", tokenizer_->vocab_size(), ")"));
        }
      }
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "prompt: exactly one of text, token_ids, chat must be set");
}

absl::StatusOr<std::vector<int32_t>> ServedModel::EncodeInput(
    const v1::TokenizeRequest& request) const {
  switch (request.input_case()) {
    case v1::TokenizeRequest::kText:
      return EncodeText(request.text(), "text");
    case v1::TokenizeRequest::kChat:
      return EncodeChat(request.chat(), "chat");
    case v1::TokenizeRequest::INPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "input: exactly one of text, chat must be set");
}

}  // namespace baton::coordinator
