// The model the coordinator serves: its tokenizer, chat template and the
// limits requests are checked against. The coordinator tokenizes every
// prompt itself, so workers only ever see token ids; it never loads weights
// (only the metadata and vocabulary of the GGUF file or HF folder).
#ifndef BATON_COORDINATOR_SERVICE_SERVED_MODEL_H_
#define BATON_COORDINATOR_SERVICE_SERVED_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/api.pb.h"
#include "model/config/model_config.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"

namespace baton::coordinator {

class ServedModel {
 public:
  // A GGUF file or an HF folder (config.json + tokenizer.json). The model id
  // is the file's general.name, or the file / folder stem without one: the
  // same rule baton-worker uses, so registrations can be matched.
  static absl::StatusOr<std::unique_ptr<ServedModel>> Load(
      const std::string& path);

  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;

  const std::string& id() const { return id_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  // The prompt of a Generate request as token ids: raw text with the
  // tokenizer's default special tokens, a chat through the template, or
  // the ids as given. InvalidArgument naming the field: no prompt, an empty
  // text or chat, a chat message with an unknown role, an id outside the
  // vocabulary, a chat on a model without a template.
  absl::StatusOr<std::vector<int32_t>> EncodePrompt(
      const v1::GenerateRequest& request) const;
  // The same for Tokenize's input.
  absl::StatusOr<std::vector<int32_t>> EncodeInput(
      const v1::TokenizeRequest& request) const;

 private:
  ServedModel() = default;
  absl::StatusOr<std::vector<int32_t>> EncodeChat(
      const v1::ChatConversation& chat, const std::string& field) const;
  absl::StatusOr<std::vector<int32_t>> EncodeText(
      const std::string& text, const std::string& field) const;

  std::string id_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_SERVED_MODEL_H_
