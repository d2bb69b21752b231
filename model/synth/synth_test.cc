#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/synth_command.h"
#include "common/mapped_file.h"
#include "common/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/float16.h"
#include "model/config/model_config.h"
#include "model/gguf/gguf_file.h"
#include "model/synth/shapes.h"
#include "model/synth/synth_model.h"
#include "model/synth/synth_vocab.h"
#include "model/synth/weight_quantizer.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::testing::HasSubstr;

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "synth_test_", ::getpid(), "_",
                      name);
}

bool SameBytes(const std::string& a, const std::string& b) {
  auto fa = MappedFile::Open(a);
  auto fb = MappedFile::Open(b);
  if (!fa.ok() || !fb.ok()) return false;
  return (*fa)->bytes().size() == (*fb)->bytes().size() &&
         std::memcmp((*fa)->bytes().data(), (*fb)->bytes().data(),
                     (*fa)->bytes().size()) == 0;
}

// Writes `shape` with RunSynth, as the CLI does.
std::string Synth(const std::string& shape, const std::string& type,
                  uint64_t seed, const std::string& name) {
  std::string path = TempPath(name);
  std::ostringstream log;
  cli::SynthOptions options{
      .shape = shape, .out_path = path, .type = type, .seed = seed};
  absl::Status s = cli::RunSynth(options, log);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(log.str(), HasSubstr("synth: wrote"));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  return path;
}

// The smollm2-135m Q4_1 file, written once for the suite.
class SynthSmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(Synth("smollm2-135m", "q4_1", 42, "smollm2.gguf"));
  }
  static void TearDownTestSuite() {
    std::remove(path_->c_str());
    delete path_;
  }
  static std::string* path_;
};
std::string* SynthSmolLM2Test::path_ = nullptr;

TEST_F(SynthSmolLM2Test, TensorTableMatchesTheDefaultModel) {
  auto real = GgufFile::Open(testing::DefaultModelPath());
  ASSERT_TRUE(real.ok()) << real.status()
                         << " (the default model: run scripts/setup.sh)";
  auto synth = GgufFile::Open(*path_);
  ASSERT_TRUE(synth.ok()) << synth.status();
  // Same tensors; the synthetic file orders layers numerically (blk.2 before
  // blk.10), the converted one lexically.
  const auto& a = (*real)->tensors();
  ASSERT_EQ(a.size(), (*synth)->tensors().size());
  for (const GgufTensorInfo& t : a) {
    const GgufTensorInfo* other = (*synth)->FindTensor(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    EXPECT_EQ(t.dtype, other->dtype) << t.name;
    EXPECT_EQ(t.shape, other->shape) << t.name;
    EXPECT_EQ(t.nbytes, other->nbytes) << t.name;
  }
  EXPECT_EQ((*synth)->tensors()[0].name, "token_embd.weight");
  EXPECT_EQ((*synth)->tensors()[10].name, "blk.1.attn_norm.weight");
  EXPECT_EQ(
      (*synth)->file_size(),
      (*real)->file_size() - (*real)->data_offset() + (*synth)->data_offset());
  // Every architecture key, and the tokenizer keys that define the model.
  for (const auto& [key, value] : (*real)->metadata()) {
    if (!key.starts_with("llama.") && key != "general.architecture" &&
        key != "general.file_type" && key != "general.quantization_version" &&
        key != "tokenizer.ggml.model" && key != "tokenizer.ggml.pre" &&
        !key.ends_with("_token_id") && !key.starts_with("tokenizer.ggml.add")) {
      continue;
    }
    const GgufValue* other = (*synth)->Find(key);
    ASSERT_NE(other, nullptr) << key;
    EXPECT_EQ(value.type(), other->type()) << key;
    EXPECT_EQ(value.DebugString(), other->DebugString()) << key;
  }
  auto tokens = (*synth)->GetArray("tokenizer.ggml.tokens", GgufType::kString);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ((*tokens)->size(), 49152u);
  EXPECT_EQ((*tokens)->GetString(1), "<|im_start|>");
  EXPECT_EQ((*tokens)->GetString(2), "<|im_end|>");

  auto real_config = ModelConfigFromGguf(**real);
  auto synth_config = ModelConfigFromGguf(**synth);
  ASSERT_TRUE(real_config.ok()) << real_config.status();
  ASSERT_TRUE(synth_config.ok()) << synth_config.status();
  ModelConfig x = *real_config;
  x.name = synth_config->name;
  EXPECT_EQ(x.DebugString(), synth_config->DebugString());
  EXPECT_EQ(synth_config->num_layers, 30);
  EXPECT_EQ(synth_config->head_dim, 64);
  EXPECT_TRUE(synth_config->tie_word_embeddings);
}

TEST_F(SynthSmolLM2Test, SameSeedSameBytesOtherSeedOtherWeights) {
  std::string again = Synth("smollm2-135m", "q4_1", 42, "smollm2_again.gguf");
  EXPECT_TRUE(SameBytes(*path_, again));
  std::remove(again.c_str());
  std::string other = Synth("tiny", "q4_1", 43, "tiny43.gguf");
  std::string tiny = Synth("tiny", "q4_1", 42, "tiny42.gguf");
  EXPECT_FALSE(SameBytes(tiny, other));
  auto a = GgufFile::Open(tiny);
  auto b = GgufFile::Open(other);
  ASSERT_TRUE(a.ok() && b.ok());
  TensorView va = *(*a)->GetTensor("blk.1.attn_q.weight");
  TensorView vb = *(*b)->GetTensor("blk.1.attn_q.weight");
  EXPECT_NE(std::memcmp(va.data, vb.data, va.nbytes), 0);
  std::remove(tiny.c_str());
  std::remove(other.c_str());
}

// Loads the file in llama.cpp (llama-cpp-python), evaluates a prompt and a
// few greedy steps; prints JSON. argv: the model, bench/ (llama_cpp_host:
// without the AMX kernels, which crash on an AMX host).
constexpr char kLlamaScript[] = R"PY(
import json, sys, time
import numpy as np
import llama_cpp
sys.path.insert(0, sys.argv[2])
import llama_cpp_host
llama_cpp_host.configure("auto")
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, verbose=False, seed=0,
                    logits_all=True)  # else scores stay zero
toks = m.tokenize(b"hello world, the quick fox", add_bos=True, special=False)
m.eval(toks)
finite = bool(np.isfinite(m.scores[m.n_tokens - 1]).all())
out = []
t0 = time.perf_counter()
for _ in range(32):
    t = int(np.argmax(m.scores[m.n_tokens - 1]))
    out.append(t)
    m.eval([t])
dt = time.perf_counter() - t0
print(json.dumps({"n_vocab": m.n_vocab(), "n_embd": m.n_embd(),
                  "prompt": toks, "finite": finite, "generated": out,
                  "decode_tok_s": 32 / dt}))
)PY";

TEST_F(SynthSmolLM2Test, LoadsInLlamaCpp) {
  std::string python = testing::PythonPath();
  ASSERT_FALSE(python.empty())
      << "BATON_PYTHON is not set; run scripts/setup.sh";
  // llama.cpp builds from source (minutes), so the default setup and CI
  // leave it out; the engine's llama.cpp checks use committed golden files.
  if (!testing::RunCommand(absl::StrCat(python, " -c 'import llama_cpp'"))
           .ok()) {
    GTEST_SKIP() << "llama-cpp-python is not installed; run "
                    "scripts/setup.sh --references to include this check";
  }
  std::string script = TempPath("llama.py");
  std::ofstream(script) << kLlamaScript;
  auto out = testing::RunCommand(absl::StrCat(
      python, " ", script, " ", *path_, " ", testing::SourceDir(), "/bench"));
  std::remove(script.c_str());
  ASSERT_TRUE(out.ok()) << out.status()
                        << " (needs llama-cpp-python in the venv)";
  nlohmann::json j = nlohmann::json::parse(*out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << *out;
  EXPECT_EQ(j["n_vocab"].get<int>(), 49152);
  EXPECT_EQ(j["n_embd"].get<int>(), 576);
  EXPECT_TRUE(j["finite"].get<bool>());
  EXPECT_EQ(j["generated"].size(), 32u);
  // "hello world" tokenizes with the letter merges: "he" "ll" "o" "Ġw" ...
  auto prompt = j["prompt"].get<std::vector<int>>();
  EXPECT_GE(prompt.size(), 8u);
  EXPECT_LT(prompt.size(), 26u);
  std::cout << "llama.cpp decode: " << j["decode_tok_s"].get<double>()
            << " tok/s\n";
}

TEST(SynthModelTest, EveryTypeQuantizesTheSameFloats) {
  std::string f32 = Synth("tiny", "bf16", 5, "tiny_bf16.gguf");
  SynthModelOptions options;
  options.weight_type = DType::kF32;
  options.seed = 5;
  options.chunk_elements = 1000;  // many chunks, rows split across threads
  options.threads = 3;
  std::string f32_path = TempPath("tiny_f32.gguf");
  ASSERT_TRUE(
      WriteSynthModel(*FindSynthShape("tiny"), options, f32_path, nullptr)
          .ok());
  auto exact = GgufFile::Open(f32_path);
  ASSERT_TRUE(exact.ok()) << exact.status();
  for (const char* type : {"q4_1", "q4_0", "q8_0", "f16", "bf16"}) {
    SCOPED_TRACE(type);
    std::string path = Synth("tiny", type, 5, absl::StrCat("tiny_", type));
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    for (const GgufTensorInfo& info : (*file)->tensors()) {
      TensorView src = (*exact)->View(*(*exact)->FindTensor(info.name));
      TensorView got = (*file)->View(info);
      std::vector<uint8_t> want(got.nbytes);
      ASSERT_TRUE(
          QuantizeWeights(info.dtype,
                          std::span(reinterpret_cast<const float*>(src.data),
                                    src.nbytes / 4),
                          want)
              .ok());
      EXPECT_EQ(std::memcmp(want.data(), got.data, got.nbytes), 0) << info.name;
    }
    std::remove(path.c_str());
  }
  // Values: uniform with std 0.02, norms exactly 1.
  TensorView embd = *(*exact)->GetTensor("token_embd.weight");
  const float* x = reinterpret_cast<const float*>(embd.data);
  double sum = 0, sum2 = 0, amax = 0;
  int64_t n = embd.NumElements();
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sum2 += x[i] * x[i];
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  }
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.02, 2e-4);
  EXPECT_LE(amax, 0.02 * std::sqrt(3.0));
  TensorView norm = *(*exact)->GetTensor("blk.1.ffn_norm.weight");
  for (int64_t i = 0; i < norm.NumElements(); ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(norm.data)[i], 1.0f);
  }
  std::remove(f32.c_str());
  std::remove(f32_path.c_str());
}

TEST(SynthModelTest, PlansRealShapes) {
  auto plan8b = PlanSynthTensors(*FindSynthShape("llama-3-8b"), DType::kQ4_1);
  ASSERT_TRUE(plan8b.ok());
  EXPECT_EQ(plan8b->size(), 1u + 32 * 9 + 2);
  EXPECT_EQ(plan8b->back().name, "output.weight");
  EXPECT_EQ(plan8b->back().dtype, DType::kQ8_0);
  EXPECT_EQ(plan8b->back().shape, (std::vector<int64_t>{128256, 4096}));
  uint64_t bytes = 0;
  for (const SynthTensor& t : *plan8b) bytes += *TensorBytes(t.dtype, t.shape);
  // 6.98e9 Q4_1 parameters, 2 x 0.525e9 Q8_0 ones.
  EXPECT_NEAR(bytes / 1e9, 5.479, 0.001);

  auto plan1b = PlanSynthTensors(*FindSynthShape("llama-3.2-1b"), DType::kF16);
  ASSERT_TRUE(plan1b.ok());
  EXPECT_EQ(plan1b->size(), 2u + 16 * 9 + 1);
  EXPECT_EQ((*plan1b)[0].name, "rope_freqs.weight");
  EXPECT_EQ((*plan1b)[1].dtype, DType::kF16);
  const SynthTensor& k = (*plan1b)[2 + 5];
  EXPECT_EQ(k.name, "blk.0.attn_k.weight");
  EXPECT_EQ(k.shape, (std::vector<int64_t>{512, 2048}));

  std::vector<float> f = SynthRopeFreqFactors(*FindSynthShape("llama-3.2-1b"));
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f.front(), 1.0f);
  EXPECT_EQ(f.back(), 32.0f);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
  EXPECT_TRUE(SynthRopeFreqFactors(*FindSynthShape("llama-3-8b")).empty());
}

TEST(SynthVocabTest, MergesAndSpecialsAreConsistent) {
  EXPECT_EQ(ByteLevelSymbol(' '), "Ġ");
  EXPECT_EQ(ByteLevelSymbol('\n'), "Ċ");
  EXPECT_EQ(ByteLevelSymbol('a'), "a");
  EXPECT_EQ(ByteLevelSymbol(0xad), "Ń");
  for (SynthTokenizerStyle style :
       {SynthTokenizerStyle::kSmolLM, SynthTokenizerStyle::kLlama3}) {
    for (int64_t size : {int64_t{2048}, int64_t{128256}}) {
      auto v = BuildSynthVocab(style, size);
      ASSERT_TRUE(v.ok()) << v.status();
      ASSERT_EQ(static_cast<int64_t>(v->tokens.size()), size);
      ASSERT_EQ(v->token_types.size(), v->tokens.size());
      std::set<std::string> unique(v->tokens.begin(), v->tokens.end());
      EXPECT_EQ(static_cast<int64_t>(unique.size()), size);
      for (const std::string& m : v->merges) {
        size_t space = m.find(' ');
        ASSERT_NE(space, std::string::npos) << m;
        EXPECT_TRUE(unique.contains(m.substr(0, space))) << m;
        EXPECT_TRUE(unique.contains(m.substr(space + 1))) << m;
        EXPECT_TRUE(unique.contains(m.substr(0, space) + m.substr(space + 1)))
            << m;
      }
      const int64_t specials = style == SynthTokenizerStyle::kLlama3 ? 256 : 3;
      EXPECT_EQ(static_cast<int64_t>(v->merges.size()), size - specials - 256);
      EXPECT_EQ(std::count(v->token_types.begin(), v->token_types.end(),
                           kSynthTokenControl),
                specials);
      EXPECT_EQ(v->token_types[v->bos_id], kSynthTokenControl);
      if (style == SynthTokenizerStyle::kLlama3) {
        EXPECT_EQ(v->tokens[v->bos_id], "<|begin_of_text|>");
        EXPECT_EQ(v->tokens[v->eos_id], "<|eot_id|>");
        EXPECT_EQ(v->eos_id, size - 256 + 9);
      } else {
        EXPECT_EQ(v->tokens[v->eos_id], "<|im_end|>");
      }
    }
  }
  EXPECT_EQ(BuildSynthVocab(SynthTokenizerStyle::kLlama3, 500).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SynthCommandTest, RejectsBadOptionsAndLeavesNoPartialFile) {
  std::ostringstream log;
  absl::Status s = cli::RunSynth(
      {.shape = "gpt-5", .out_path = TempPath("x.gguf"), .type = "q4_1"}, log);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("smollm2-135m, llama-3.2-1b, llama-3-8b"));
  s = cli::RunSynth(
      {.shape = "tiny", .out_path = TempPath("x.gguf"), .type = "q6_k"}, log);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("q4_1"));
  EXPECT_THAT(s.message(), HasSubstr("f16"));
  s = cli::RunSynth({.shape = "tiny", .out_path = "", .type = "f16"}, log);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::string missing_dir = "/nonexistent-synth-dir/x.gguf";
  s = cli::RunSynth({.shape = "tiny", .out_path = missing_dir, .type = "f16"},
                    log);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(missing_dir + ".partial"));
}

}  // namespace
}  // namespace baton
