// The prompts of a benchmark: synthetic token-id prompts of chosen lengths
// (`random`) or the first turns of ShareGPT conversations (`sharegpt`).
// Output lengths are fixed per prompt and enforced with ignore_eos, so two
// runs over the same prompts do the same work.
#ifndef BATON_BENCH_SERVING_DATASET_H_
#define BATON_BENCH_SERVING_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::bench {

// One request of a workload. Exactly one of token_ids / chat_text is set.
struct BenchPrompt {
  // A pre-tokenized prompt (GenerateRequest.token_ids); exact length.
  std::vector<int32_t> token_ids;
  // The content of a one-message user chat (GenerateRequest.chat).
  std::string chat_text;
  // Prompt tokens: token_ids.size(), or the chat's token count as the
  // TokenCounter gave it (the server's usage.prompt_tokens is preferred when
  // the request completes).
  int input_len = 0;
  // Tokens to generate: SamplingParams.max_tokens, with ignore_eos. >= 1.
  int output_len = 0;
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  // Mean prompt and output lengths in tokens, >= 1.
  int input_len = 1024;
  int output_len = 128;
  // In [0, 1): each length is uniform over the integers in
  // [floor(len * (1 - ratio)), ceil(len * (1 + ratio))], at least 1.
  double range_ratio = 0.0;
  // Tokens of a prefix every prompt starts with (drawn once, then each
  // prompt's own input_len tokens follow), as vLLM's --random-prefix-len:
  // the shared-prefix workload of a system prompt or few-shot preamble.
  // >= 0.
  int prefix_len = 0;
  // Prompt token ids are uniform in [vocab_begin, vocab_end): a range of
  // ordinary tokens (no special or byte tokens) of the served vocabulary.
  int32_t vocab_begin = 1000;
  int32_t vocab_end = 40000;
};

// INVALID_ARGUMENT naming the flag when a field is out of range.
absl::Status ValidateRandomDatasetOptions(const RandomDatasetOptions& options);

// num_prompts prompts drawn from `seed` (same seed, same prompts).
absl::StatusOr<std::vector<BenchPrompt>> SampleRandomPrompts(
    const RandomDatasetOptions& options, uint64_t seed);

// Counts tokens as the served model does (the server's Tokenize RPC, or a
// stand-in in tests).
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  // Tokens of plain text (a reply's length).
  virtual absl::StatusOr<int> CountText(absl::string_view text) = 0;
  // Tokens of a one-message user chat rendered with the chat template.
  virtual absl::StatusOr<int> CountChat(absl::string_view user_text) = 0;
};

struct ShareGptOptions {
  // A JSON array of {"conversations": [{"from": "human", "value": ...},
  // {"from": "gpt", "value": ...}, ...]}. Required.
  std::string path;
  int num_prompts = 1000;
  // > 0: every prompt generates this many tokens; 0: as many as the
  // conversation's reply has.
  int output_len = 0;
  // Conversations outside these bounds are skipped (counted as filtered).
  int min_len = 4;            // prompt and reply tokens, each
  int max_prompt_len = 1024;  // prompt tokens
  int max_total_len = 2048;   // prompt + output tokens
};

struct ShareGptSample {
  std::vector<BenchPrompt> prompts;  // num_prompts of them
  int entries_total = 0;             // entries in the file
  // Of the entries examined (in shuffled order, until num_prompts were
  // found): no human turn followed by a gpt turn, ...
  int entries_malformed = 0;
  // Of the entries examined: outside ShareGptOptions' length bounds.
  int entries_filtered = 0;
  // Prompts that repeat an earlier one because the file had fewer usable
  // conversations than num_prompts.
  int prompts_repeated = 0;
};

// Shuffles the file's conversations with `seed`, then takes usable ones in
// that order until num_prompts; repeats them if the file runs out. Only the
// conversations taken are tokenized. NOT_FOUND for a missing file,
// INVALID_ARGUMENT for a file that is not a JSON array or has no usable
// conversation, and TokenCounter's errors as they are.
absl::StatusOr<ShareGptSample> SampleShareGpt(const ShareGptOptions& options,
                                              TokenCounter& counter,
                                              uint64_t seed);

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_DATASET_H_
