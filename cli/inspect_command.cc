#include "cli/inspect_command.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/config/model_config.h"
#include "model/gguf/gguf_file.h"
#include "model/safetensors/safetensors_model.h"
#include "model/tensor.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"

namespace baton::cli {
namespace {

struct TensorRow {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

void PrintTensorTable(const std::vector<TensorRow>& rows, std::ostream& out) {
  size_t name_width = 4;
  for (const TensorRow& r : rows)
    name_width = std::max(name_width, r.name.size());
  out << absl::StrFormat("%-*s  %-5s  %-16s  %12s\n", name_width, "name",
                         "type", "shape", "bytes");
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  for (const TensorRow& r : rows) {
    out << absl::StrFormat("%-*s  %-5s  %-16s  %12d\n", name_width, r.name,
                           DTypeName(r.dtype), ShapeToString(r.shape),
                           r.nbytes);
    total_bytes += r.nbytes;
    int64_t n = 1;
    for (int64_t d : r.shape) n *= d;
    total_elements += n;
  }
  out << absl::StrFormat("%d tensors, %d parameters, %d bytes (%.1f MiB)\n",
                         rows.size(), total_elements, total_bytes,
                         total_bytes / 1048576.0);
}

std::string TokenLabel(const Tokenizer& t, std::optional<int32_t> id) {
  if (!id.has_value()) return "none";
  return absl::StrCat(*id, " ", t.TokenText(*id));
}

void PrintTokenizer(const Tokenizer& t, std::ostream& out) {
  out << "\ntokenizer:           byte-level BPE, " << t.vocab_size()
      << " tokens, pre-tokenizer '" << t.pre_tokenizer_name() << "'\n";
  out << "bos:                 " << TokenLabel(t, t.bos_id())
      << (t.add_bos_default() ? " (added)" : " (not added)") << "\n";
  out << "eos:                 " << TokenLabel(t, t.eos_id()) << "\n";
  out << "end of generation:  ";
  for (int32_t id : t.end_of_generation_ids()) out << " " << TokenLabel(t, id);
  out << "\n";
  auto chat = ChatTemplate::ForTokenizer(t);
  out << "chat template:       "
      << (chat.ok()
              ? (chat->format() == ChatTemplateFormat::kChatMl ? "ChatML"
                                                               : "Llama-3")
              : std::string(chat.status().message()))
      << "\n";
  for (const std::string& note : t.notes())
    out << "note:                " << note << "\n";
}

absl::Status InspectSafetensors(const InspectOptions& options,
                                std::ostream& out) {
  BATON_ASSIGN_OR_RETURN(auto model,
                         SafetensorsModel::Open(options.model_path));
  out << "folder:              " << model->directory() << "\n";
  out << "format:              safetensors, " << model->num_shards()
      << " shard(s)\n";
  BATON_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromHfConfigFile(
                                                 model->config_json_path()));
  config.tie_word_embeddings = model->FindTensor("lm_head.weight") == nullptr;
  out << config.DebugString();
  auto tokenizer =
      Tokenizer::FromHfJson(model->directory() + "/tokenizer.json");
  if (tokenizer.ok()) {
    PrintTokenizer(**tokenizer, out);
  } else {
    out << "\ntokenizer:           " << tokenizer.status().message() << "\n";
  }
  out << "\n";
  std::vector<TensorRow> rows;
  for (const SafetensorsModelTensor& t : model->tensors()) {
    if (!t.info->dtype.has_value()) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor '", t.info->name, "' has dtype ", t.info->dtype_name));
    }
    rows.push_back(
        {t.info->name, *t.info->dtype, t.info->shape, t.info->nbytes});
  }
  PrintTensorTable(rows, out);
  return absl::OkStatus();
}

absl::Status InspectGguf(const InspectOptions& options, std::ostream& out) {
  BATON_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(options.model_path));
  out << "file:                " << options.model_path << "\n";
  out << absl::StrFormat(
      "format:              GGUF v%d, alignment %d, %d bytes\n",
      gguf->version(), gguf->alignment(), gguf->file_size());
  BATON_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(*gguf));
  out << config.DebugString();
  BATON_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromGguf(*gguf));
  PrintTokenizer(*tokenizer, out);
  if (options.show_metadata) {
    out << "\nmetadata:\n";
    for (const auto& [key, value] : gguf->metadata()) {
      out << "  " << key << " = " << value.DebugString() << "\n";
    }
  }
  out << "\n";
  std::vector<TensorRow> rows;
  for (const GgufTensorInfo& t : gguf->tensors()) {
    rows.push_back({t.name, t.dtype, t.shape, t.nbytes});
  }
  PrintTensorTable(rows, out);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunInspect(const InspectOptions& options, std::ostream& out) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError("--model is required");
  }
  const std::string& p = options.model_path;
  if (p.size() > 5 && p.substr(p.size() - 5) == ".gguf")
    return InspectGguf(options, out);
  return InspectSafetensors(options, out);
}

}  // namespace baton::cli
