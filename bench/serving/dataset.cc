#include "bench/serving/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace baton::bench {
namespace {

using Json = nlohmann::json;

// Keeps the prompt stream apart from the arrival stream of the same seed.
constexpr uint64_t kPromptStream = 0x70726f6d70747321ull;

// The integers [floor(len * (1 - ratio)), ceil(len * (1 + ratio))], >= 1.
std::uniform_int_distribution<int> LengthDistribution(int len, double ratio) {
  const int low = std::max(1, static_cast<int>(std::floor(len * (1 - ratio))));
  const int high =
      std::max(low, static_cast<int>(std::ceil(len * (1 + ratio))));
  return std::uniform_int_distribution<int>(low, high);
}

// A usable conversation: the first human turn and the gpt turn after it.
struct Turns {
  std::string human;
  std::string gpt;
};

std::optional<Turns> FirstTurns(const Json& entry) {
  if (!entry.is_object()) return std::nullopt;
  const auto it = entry.find("conversations");
  if (it == entry.end() || !it->is_array()) return std::nullopt;
  const Json& turns = *it;
  for (size_t i = 0; i + 1 < turns.size(); ++i) {
    const Json& h = turns[i];
    if (!h.is_object() || h.value("from", Json()) != "human") continue;
    const Json& g = turns[i + 1];
    if (!g.is_object() || g.value("from", Json()) != "gpt") return std::nullopt;
    const Json hv = h.value("value", Json());
    const Json gv = g.value("value", Json());
    if (!hv.is_string() || !gv.is_string()) return std::nullopt;
    Turns t{hv.get<std::string>(), gv.get<std::string>()};
    if (t.human.empty() || t.gpt.empty()) return std::nullopt;
    return t;
  }
  return std::nullopt;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--dataset-path: cannot open '", path, "'"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  try {
    return Json::parse(contents.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset-path: '", path, "' is not valid JSON: ", e.what()));
  }
}

}  // namespace

absl::Status ValidateRandomDatasetOptions(const RandomDatasetOptions& options) {
  if (options.num_prompts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-prompts must be >= 1, got ", options.num_prompts));
  }
  if (options.input_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-input-len must be >= 1, got ", options.input_len));
  }
  if (options.output_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-output-len must be >= 1, got ", options.output_len));
  }
  if (options.prefix_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-prefix-len must be >= 0, got ", options.prefix_len));
  }
  if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-range-ratio must be in [0, 1), got ", options.range_ratio));
  }
  if (options.vocab_begin < 0 || options.vocab_end <= options.vocab_begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-range must be BEGIN:END with 0 <= BEGIN < END, "
                     "got ",
                     options.vocab_begin, ":", options.vocab_end));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BenchPrompt>> SampleRandomPrompts(
    const RandomDatasetOptions& options, uint64_t seed) {
  BATON_RETURN_IF_ERROR(ValidateRandomDatasetOptions(options));
  std::mt19937_64 rng(seed ^ kPromptStream);
  auto input_len = LengthDistribution(options.input_len, options.range_ratio);
  auto output_len = LengthDistribution(options.output_len, options.range_ratio);
  std::uniform_int_distribution<int32_t> token(options.vocab_begin,
                                               options.vocab_end - 1);
  std::vector<int32_t> prefix(static_cast<size_t>(options.prefix_len));
  for (int32_t& id : prefix) id = token(rng);
  std::vector<BenchPrompt> prompts(options.num_prompts);
  for (BenchPrompt& p : prompts) {
    const int own = input_len(rng);
    p.output_len = output_len(rng);
    p.input_len = options.prefix_len + own;
    p.token_ids = prefix;
    p.token_ids.resize(static_cast<size_t>(p.input_len));
    for (size_t i = prefix.size(); i < p.token_ids.size(); ++i) {
      p.token_ids[i] = token(rng);
    }
  }
  return prompts;
}

absl::StatusOr<ShareGptSample> SampleShareGpt(const ShareGptOptions& options,
                                              TokenCounter& counter,
                                              uint64_t seed) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError(
        "--dataset-path is required with --dataset-name=sharegpt");
  }
  if (options.num_prompts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-prompts must be >= 1, got ", options.num_prompts));
  }
  if (options.output_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sharegpt-output-len must be >= 0, got ", options.output_len));
  }
  BATON_ASSIGN_OR_RETURN(const Json file, ReadJsonFile(options.path));
  if (!file.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset-path: '", options.path,
        "' is not a ShareGPT file: the top level must be a JSON array of "
        "{\"conversations\": [...]}, got a JSON ",
        file.type_name()));
  }
  ShareGptSample sample;
  sample.entries_total = static_cast<int>(file.size());
  std::vector<size_t> order(file.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed ^ kPromptStream);
  std::shuffle(order.begin(), order.end(), rng);

  for (size_t index : order) {
    if (static_cast<int>(sample.prompts.size()) == options.num_prompts) break;
    std::optional<Turns> turns = FirstTurns(file[index]);
    if (!turns.has_value()) {
      ++sample.entries_malformed;
      continue;
    }
    BATON_ASSIGN_OR_RETURN(const int prompt_len,
                           counter.CountChat(turns->human));
    int output_len = options.output_len;
    if (output_len == 0) {
      BATON_ASSIGN_OR_RETURN(output_len, counter.CountText(turns->gpt));
    }
    const bool too_short =
        prompt_len < options.min_len ||
        (options.output_len == 0 && output_len < options.min_len);
    if (too_short || prompt_len > options.max_prompt_len ||
        prompt_len + output_len > options.max_total_len) {
      ++sample.entries_filtered;
      continue;
    }
    BenchPrompt p;
    p.chat_text = std::move(turns->human);
    p.input_len = prompt_len;
    p.output_len = output_len;
    sample.prompts.push_back(std::move(p));
  }
  if (sample.prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset-path: '", options.path, "' has no usable conversation (",
        sample.entries_total, " entries, ", sample.entries_malformed,
        " without a human turn followed by a gpt turn, ",
        sample.entries_filtered, " outside the length bounds)"));
  }
  const size_t usable = sample.prompts.size();
  for (size_t i = 0;
       static_cast<int>(sample.prompts.size()) < options.num_prompts; ++i) {
    BenchPrompt repeat = sample.prompts[i % usable];
    sample.prompts.push_back(std::move(repeat));
    ++sample.prompts_repeated;
  }
  return sample;
}

}  // namespace baton::bench
