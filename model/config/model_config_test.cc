#include "model/config/model_config.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

std::string DefaultModelPath() {
  const char* path = std::getenv("BATON_DEFAULT_MODEL");
  return path != nullptr ? path : "";
}

TEST(ModelConfigTest, ReadsDefaultModelFromGguf) {
  auto gguf = GgufFile::Open(DefaultModelPath());
  ASSERT_TRUE(gguf.ok()) << gguf.status()
                         << " (run scripts/setup.sh to fetch the model)";
  auto c = ModelConfigFromGguf(**gguf);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->gqa_group(), 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->kv_dim(), 192);
  EXPECT_EQ(c->rope_dim, 64);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->context_length, 8192);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_THAT(c->DebugString(), HasSubstr("kv heads 3"));
}

constexpr char kSmolLm2Json[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
  "rope_theta": 100000, "rope_scaling": null, "tie_word_embeddings": true,
  "attention_bias": false, "torch_dtype": "bfloat16"})";

TEST(ModelConfigTest, HfJsonMatchesGgufForTheSameModel) {
  auto hf = ModelConfigFromHfJson(kSmolLm2Json);
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto gguf = GgufFile::Open(DefaultModelPath());
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto gg = ModelConfigFromGguf(**gguf);
  ASSERT_TRUE(gg.ok()) << gg.status();
  EXPECT_EQ(hf->num_layers, gg->num_layers);
  EXPECT_EQ(hf->hidden_size, gg->hidden_size);
  EXPECT_EQ(hf->intermediate_size, gg->intermediate_size);
  EXPECT_EQ(hf->num_heads, gg->num_heads);
  EXPECT_EQ(hf->num_kv_heads, gg->num_kv_heads);
  EXPECT_EQ(hf->head_dim, gg->head_dim);
  EXPECT_EQ(hf->vocab_size, gg->vocab_size);
  EXPECT_EQ(hf->context_length, gg->context_length);
  EXPECT_DOUBLE_EQ(hf->rope_theta, gg->rope_theta);
  EXPECT_EQ(hf->tie_word_embeddings, gg->tie_word_embeddings);
  // The one intended difference: HF checkpoints rotate halves.
  EXPECT_EQ(hf->rope_style, RopeStyle::kHalfSplit);
}

TEST(ModelConfigTest, Llama3RopeScalingAndHeadDim) {
  auto c = ModelConfigFromHfJson(R"({
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": true,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.original_context_length, 8192);
  EXPECT_EQ(c->gqa_group(), 4);
  EXPECT_EQ(c->head_dim, 64);
}

TEST(ModelConfigTest, Qwen2DefaultsToAttentionBias) {
  auto c = ModelConfigFromHfJson(R"({
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->head_dim, 64);
}

struct BadJsonCase {
  const char* json;
  absl::StatusCode code;
  const char* message;
};

class ModelConfigBadJsonTest : public ::testing::TestWithParam<BadJsonCase> {};

TEST_P(ModelConfigBadJsonTest, RejectsWithClearMessage) {
  auto c = ModelConfigFromHfJson(GetParam().json);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), GetParam().code);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ModelConfigBadJsonTest,
    ::testing::Values(
        BadJsonCase{"{", absl::StatusCode::kInvalidArgument, "malformed JSON"},
        BadJsonCase{"[]", absl::StatusCode::kInvalidArgument, "object"},
        BadJsonCase{"{}", absl::StatusCode::kInvalidArgument, "model_type"},
        BadJsonCase{R"({"model_type": "gpt2"})",
                    absl::StatusCode::kUnimplemented, "'gpt2'"},
        BadJsonCase{R"({"model_type": "llama", "num_hidden_layers": 2})",
                    absl::StatusCode::kInvalidArgument, "'hidden_size'"},
        BadJsonCase{R"({"model_type": "llama", "num_hidden_layers": "2"})",
                    absl::StatusCode::kInvalidArgument,
                    "'num_hidden_layers' must be an integer"},
        BadJsonCase{R"({"model_type": "llama", "num_hidden_layers": 2,
            "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 3,
            "vocab_size": 10, "max_position_embeddings": 16})",
                    absl::StatusCode::kInvalidArgument, "multiple of"},
        BadJsonCase{R"({"model_type": "llama", "num_hidden_layers": 2,
            "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "vocab_size": 10,
            "max_position_embeddings": 16, "rms_norm_eps": -1})",
                    absl::StatusCode::kInvalidArgument, "rms_norm_eps"},
        BadJsonCase{R"({"model_type": "llama", "num_hidden_layers": 2,
            "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "vocab_size": 10,
            "max_position_embeddings": 16,
            "rope_scaling": {"rope_type": "dynamic", "factor": 2}})",
                    absl::StatusCode::kUnimplemented, "dynamic"}));

}  // namespace
}  // namespace baton
