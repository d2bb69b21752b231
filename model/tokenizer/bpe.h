// Byte-level BPE: encodes one pre-tokenized piece (raw bytes) into token ids
// by repeatedly merging the adjacent pair of lowest merge rank (ties: the
// leftmost pair), starting from single bytes.
#ifndef BATON_MODEL_TOKENIZER_BPE_H_
#define BATON_MODEL_TOKENIZER_BPE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

struct BpeOptions {
  // Emit a piece that is itself a token as that token, without merging
  // (HF "ignore_merges", as Llama-3 does).
  bool ignore_merges = false;
  // Reject merges whose parts or result are not tokens (HF does; llama.cpp
  // accepts them and falls back to byte tokens at the end).
  bool require_merges_in_vocab = false;
};

class BpeModel {
 public:
  // `token_keys[id]`: the raw bytes that token `id` matches (an empty key
  // never matches). `merges`: pairs of raw byte strings, rank = index; a
  // repeated pair keeps its first rank.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::vector<std::string>& token_keys,
      const std::vector<std::pair<std::string, std::string>>& merges,
      const BpeOptions& options);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `piece` to `out`. A final symbol that is not a token
  // is emitted as the tokens of its single bytes (bytes without one are
  // dropped, as llama.cpp does). Thread-safe.
  void Encode(absl::string_view piece, std::vector<int32_t>* out) const;

  // The token whose key is `bytes`, or -1.
  int32_t Find(absl::string_view bytes) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id
  };
  BpeModel() = default;
  int32_t Intern(const std::string& s);
  void EmitSymbol(int32_t sym, std::vector<int32_t>* out) const;

  BpeOptions options_;
  // Symbols: every byte, every token key, every merge part and result.
  std::unordered_map<std::string, int32_t> symbol_of_;
  std::vector<std::string> symbol_bytes_;
  std::vector<int32_t> symbol_token_;  // token id or -1
  int32_t byte_symbol_[256];
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right)
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_BPE_H_
