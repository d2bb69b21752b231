// AddSynthMetadata and SynthFileType (declared in synth_model.h).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/synth/synth_model.h"
#include "model/synth/synth_vocab.h"

namespace baton {

absl::StatusOr<uint32_t> SynthFileType(DType weight_type) {
  switch (weight_type) {  // llama_ftype values
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ8_0:
      return 7;
    case DType::kBF16:
      return 32;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic models cannot have ", DTypeName(weight_type),
                       " weights (supported: F32, F16, BF16, Q4_0, Q4_1, "
                       "Q8_0)"));
  }
}

absl::Status AddSynthMetadata(const SynthShape& shape, DType weight_type,
                              GgufWriter& w) {
  BATON_ASSIGN_OR_RETURN(uint32_t file_type, SynthFileType(weight_type));
  BATON_ASSIGN_OR_RETURN(SynthVocab vocab,
                         BuildSynthVocab(shape.tokenizer, shape.vocab_size));
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };

  BATON_RETURN_IF_ERROR(w.AddString("general.architecture", "llama"));
  BATON_RETURN_IF_ERROR(w.AddString("general.type", "model"));
  BATON_RETURN_IF_ERROR(w.AddString("general.name", shape.display_name));
  BATON_RETURN_IF_ERROR(w.AddString("general.basename", shape.name));
  BATON_RETURN_IF_ERROR(w.AddString("general.license", "apache-2.0"));

  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.block_count", u32(shape.num_layers)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.context_length", u32(shape.context_length)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.embedding_length", u32(shape.hidden_size)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.feed_forward_length", u32(shape.intermediate_size)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.attention.head_count", u32(shape.num_heads)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.attention.head_count_kv", u32(shape.num_kv_heads)));
  BATON_RETURN_IF_ERROR(w.AddFloat32("llama.rope.freq_base", shape.rope_theta));
  BATON_RETURN_IF_ERROR(w.AddFloat32("llama.attention.layer_norm_rms_epsilon",
                                     shape.rms_norm_eps));
  if (shape.write_head_dim_keys) {
    BATON_RETURN_IF_ERROR(
        w.AddUint32("llama.attention.key_length", u32(shape.head_dim)));
    BATON_RETURN_IF_ERROR(
        w.AddUint32("llama.attention.value_length", u32(shape.head_dim)));
  }
  BATON_RETURN_IF_ERROR(w.AddUint32("general.file_type", file_type));
  BATON_RETURN_IF_ERROR(w.AddUint32("llama.vocab_size", u32(shape.vocab_size)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("llama.rope.dimension_count", u32(shape.head_dim)));

  if (shape.tokenizer == SynthTokenizerStyle::kSmolLM) {
    BATON_RETURN_IF_ERROR(w.AddBool("tokenizer.ggml.add_space_prefix", false));
  }
  BATON_RETURN_IF_ERROR(
      w.AddBool("tokenizer.ggml.add_bos_token", vocab.add_bos));
  BATON_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.model", "gpt2"));
  BATON_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.pre", vocab.pre));
  BATON_RETURN_IF_ERROR(
      w.AddStringArray("tokenizer.ggml.tokens", vocab.tokens));
  BATON_RETURN_IF_ERROR(
      w.AddArray("tokenizer.ggml.token_type",
                 std::span<const int32_t>(vocab.token_types)));
  BATON_RETURN_IF_ERROR(
      w.AddStringArray("tokenizer.ggml.merges", vocab.merges));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("tokenizer.ggml.bos_token_id", u32(vocab.bos_id)));
  BATON_RETURN_IF_ERROR(
      w.AddUint32("tokenizer.ggml.eos_token_id", u32(vocab.eos_id)));
  if (vocab.unknown_id >= 0) {
    BATON_RETURN_IF_ERROR(
        w.AddUint32("tokenizer.ggml.unknown_token_id", u32(vocab.unknown_id)));
  }
  if (vocab.padding_id >= 0) {
    BATON_RETURN_IF_ERROR(
        w.AddUint32("tokenizer.ggml.padding_token_id", u32(vocab.padding_id)));
  }
  BATON_RETURN_IF_ERROR(
      w.AddString("tokenizer.chat_template", vocab.chat_template));
  BATON_RETURN_IF_ERROR(w.AddUint32("general.quantization_version", 2));
  return absl::OkStatus();
}

}  // namespace baton
