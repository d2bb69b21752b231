#include "model/synth/synth_model.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/synth/synth_random.h"
#include "model/synth/weight_quantizer.h"

namespace baton {
namespace {

DType EmbeddingType(DType weight_type) {
  switch (weight_type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
      return DType::kQ8_0;
    default:
      return weight_type;
  }
}

// Fills `out` with elements [first, first + out.size()) of tensor `t`.
void Fill(const SynthTensor& t, const std::vector<float>& rope_freqs,
          uint64_t key, float half_width, uint64_t first,
          std::span<float> out) {
  switch (t.fill) {
    case SynthFill::kRandom:
      SynthFillUniform(key, first, half_width, out);
      break;
    case SynthFill::kOnes:
      std::fill(out.begin(), out.end(), 1.0f);
      break;
    case SynthFill::kRopeFreqs:
      for (size_t j = 0; j < out.size(); ++j) out[j] = rope_freqs[first + j];
      break;
  }
}

// Free bytes on the file system holding `path`'s directory; -1 if unknown.
int64_t FreeBytes(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

}  // namespace

absl::StatusOr<std::vector<SynthTensor>> PlanSynthTensors(
    const SynthShape& shape, DType weight_type) {
  BATON_RETURN_IF_ERROR(SynthFileType(weight_type).status());
  const DType embd = EmbeddingType(weight_type);
  const int64_t h = shape.hidden_size;
  const int64_t q_dim = shape.num_heads * shape.head_dim;
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim;
  const int64_t ffn = shape.intermediate_size;
  std::vector<SynthTensor> t;
  if (shape.rope_scaling_factor > 0.0f) {
    t.push_back({"rope_freqs.weight",
                 DType::kF32,
                 {shape.head_dim / 2},
                 SynthFill::kRopeFreqs});
  }
  t.push_back(
      {"token_embd.weight", embd, {shape.vocab_size, h}, SynthFill::kRandom});
  // Per layer in the default model's order.
  for (int64_t i = 0; i < shape.num_layers; ++i) {
    std::string p = absl::StrCat("blk.", i, ".");
    t.push_back({p + "attn_norm.weight", DType::kF32, {h}, SynthFill::kOnes});
    t.push_back(
        {p + "ffn_down.weight", weight_type, {h, ffn}, SynthFill::kRandom});
    t.push_back(
        {p + "ffn_gate.weight", weight_type, {ffn, h}, SynthFill::kRandom});
    t.push_back(
        {p + "ffn_up.weight", weight_type, {ffn, h}, SynthFill::kRandom});
    t.push_back({p + "ffn_norm.weight", DType::kF32, {h}, SynthFill::kOnes});
    t.push_back(
        {p + "attn_k.weight", weight_type, {kv_dim, h}, SynthFill::kRandom});
    t.push_back({p + "attn_output.weight",
                 weight_type,
                 {h, q_dim},
                 SynthFill::kRandom});
    t.push_back(
        {p + "attn_q.weight", weight_type, {q_dim, h}, SynthFill::kRandom});
    t.push_back(
        {p + "attn_v.weight", weight_type, {kv_dim, h}, SynthFill::kRandom});
  }
  t.push_back({"output_norm.weight", DType::kF32, {h}, SynthFill::kOnes});
  if (!shape.tie_word_embeddings) {
    t.push_back(
        {"output.weight", embd, {shape.vocab_size, h}, SynthFill::kRandom});
  }
  for (const SynthTensor& x : t) {
    auto bytes = TensorBytes(x.dtype, x.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", shape.name,
                                                     ": tensor ", x.name, ": ",
                                                     bytes.status().message()));
    }
  }
  return t;
}

absl::Status WriteSynthModel(const SynthShape& shape,
                             const SynthModelOptions& options,
                             const std::string& path, std::ostream* log) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto seconds = [&start] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  if (options.chunk_elements <= 0 || options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elements must be > 0 and threads >= 0, got ",
                     options.chunk_elements, " and ", options.threads));
  }
  BATON_ASSIGN_OR_RETURN(std::vector<SynthTensor> tensors,
                         PlanSynthTensors(shape, options.weight_type));
  BATON_ASSIGN_OR_RETURN(auto writer, GgufWriter::Create(path));
  BATON_RETURN_IF_ERROR(AddSynthMetadata(shape, options.weight_type, *writer));
  for (const SynthTensor& t : tensors) {
    BATON_RETURN_IF_ERROR(writer->AddTensor(t.name, t.dtype, t.shape));
  }
  const uint64_t total = writer->ExpectedFileSize();
  const int64_t free_bytes = FreeBytes(path);
  if (free_bytes >= 0 && static_cast<uint64_t>(free_bytes) < total) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s needs %d bytes but its file system has %d free",
                        path, total, free_bytes));
  }
  if (log != nullptr) {
    *log << absl::StrFormat("synth: %s, %s, %d tensors, %.2f GB -> %s\n",
                            shape.name, DTypeName(options.weight_type),
                            tensors.size(), total / 1e9, path);
  }

  const int threads =
      options.threads > 0
          ? options.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::vector<float> rope_freqs = SynthRopeFreqFactors(shape);
  const float half_width = options.weight_std * std::sqrt(3.0f);
  std::vector<float> values;
  std::vector<uint8_t> bytes;
  uint64_t written = 0;
  for (const SynthTensor& t : tensors) {
    const DTypeInfo& info = GetDTypeInfo(t.dtype);
    const int64_t row = t.shape.back();
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= t.shape[d];
    const int64_t row_bytes = row / info.block_size * info.block_bytes;
    const int64_t chunk_rows =
        std::max<int64_t>(1, options.chunk_elements / row);
    const uint64_t key = SynthStreamKey(options.seed, t.name);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - r0);
      values.resize(n * row);
      bytes.resize(n * row_bytes);
      // Each worker fills and quantizes a contiguous range of whole rows.
      const int workers = static_cast<int>(
          std::min<int64_t>(threads, n * row >= 65536 ? n : 1));
      std::vector<absl::Status> status(workers);
      auto work = [&](int w) {
        const int64_t a = n * w / workers;
        const int64_t b = n * (w + 1) / workers;
        std::span<float> v(values.data() + a * row, (b - a) * row);
        Fill(t, rope_freqs, key, half_width, (r0 + a) * row, v);
        status[w] =
            QuantizeWeights(t.dtype, v,
                            std::span<uint8_t>(bytes.data() + a * row_bytes,
                                               (b - a) * row_bytes));
      };
      std::vector<std::thread> pool;
      for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
      work(0);
      for (std::thread& th : pool) th.join();
      for (const absl::Status& s : status) BATON_RETURN_IF_ERROR(s);
      BATON_RETURN_IF_ERROR(writer->WriteTensorData(bytes));
      written += bytes.size();
    }
    const bool layer_done = absl::EndsWith(t.name, ".attn_v.weight");
    if (log != nullptr && (layer_done || t.name == "token_embd.weight")) {
      *log << absl::StrFormat("synth: %-22s %7.2f / %.2f GB  %6.1f s\n", t.name,
                              written / 1e9, total / 1e9, seconds());
    }
  }
  BATON_RETURN_IF_ERROR(writer->Finish());
  if (log != nullptr) {
    *log << absl::StrFormat("synth: wrote %s (%.2f GB) in %.1f s\n", path,
                            total / 1e9, seconds());
  }
  return absl::OkStatus();
}

}  // namespace baton
