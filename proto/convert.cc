#include "proto/convert.h"

#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.has_temperature() ? proto.temperature() : 1.0;
  params.top_k = proto.top_k();
  params.top_p = proto.has_top_p() ? proto.top_p() : 1.0;
  params.min_p = proto.min_p();
  params.repetition_penalty =
      proto.has_repetition_penalty() ? proto.repetition_penalty() : 1.0;
  params.frequency_penalty = proto.frequency_penalty();
  params.presence_penalty = proto.presence_penalty();
  if (!proto.has_seed()) {
    return absl::InvalidArgumentError(
        "sampling.seed: required on worker RPCs (the effective seed)");
  }
  params.seed = proto.seed();
  params.max_tokens = proto.has_max_tokens() ? proto.max_tokens() : 16;
  params.stop_token_ids.assign(proto.stop_token_ids().begin(),
                               proto.stop_token_ids().end());
  params.stop.assign(proto.stop().begin(), proto.stop().end());
  params.ignore_eos = proto.ignore_eos();
  if (proto.has_logprobs()) params.logprobs = proto.logprobs();
  params.show_probs = proto.show_probs();
  absl::Status valid = ValidateSamplingFields(params);
  if (!valid.ok()) return valid;
  return params;
}

namespace {

v1::KvDtype DtypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return v1::KV_DTYPE_F16;
    case DType::kF32:
      return v1::KV_DTYPE_F32;
    default:
      return v1::KV_DTYPE_UNSPECIFIED;
  }
}

}  // namespace

v1::KvLayout ToProto(const KvLayout& layout) {
  v1::KvLayout proto;
  proto.set_num_layers(static_cast<int32_t>(layout.num_layers));
  proto.set_num_kv_heads(static_cast<int32_t>(layout.num_kv_heads));
  proto.set_head_dim(static_cast<int32_t>(layout.head_dim));
  proto.set_block_size(static_cast<int32_t>(layout.block_size));
  proto.set_dtype(DtypeToProto(layout.dtype));
  return proto;
}

bool LayoutEquals(const v1::KvLayout& proto, const KvLayout& layout) {
  return proto.num_layers() == layout.num_layers &&
         proto.num_kv_heads() == layout.num_kv_heads &&
         proto.head_dim() == layout.head_dim &&
         proto.block_size() == layout.block_size &&
         proto.dtype() == DtypeToProto(layout.dtype);
}

absl::StatusOr<KvLayout> FromProto(const v1::KvLayout& proto) {
  KvLayout layout;
  layout.num_layers = proto.num_layers();
  layout.num_kv_heads = proto.num_kv_heads();
  layout.head_dim = proto.head_dim();
  layout.block_size = proto.block_size();
  switch (proto.dtype()) {
    case v1::KV_DTYPE_F16:
      layout.dtype = DType::kF16;
      break;
    case v1::KV_DTYPE_F32:
      layout.dtype = DType::kF32;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kv_layout.dtype: ", v1::KvDtype_Name(proto.dtype()),
                       " is not F16 or F32"));
  }
  return layout;
}

}  // namespace baton
