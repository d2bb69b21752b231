#include "model/tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

struct Candidate {
  int32_t rank;
  int32_t left;  // symbol position
  int32_t left_sym;
  int32_t right_sym;
  // std::priority_queue pops the largest: the largest is the lowest rank,
  // then the leftmost position.
  bool operator<(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

int32_t BpeModel::Intern(const std::string& s) {
  auto [it, inserted] =
      symbol_of_.emplace(s, static_cast<int32_t>(symbol_bytes_.size()));
  if (inserted) {
    symbol_bytes_.push_back(s);
    symbol_token_.push_back(-1);
  }
  return it->second;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::vector<std::string>& token_keys,
    const std::vector<std::pair<std::string, std::string>>& merges,
    const BpeOptions& options) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  model->options_ = options;
  model->symbol_of_.reserve(token_keys.size() + merges.size() / 4 + 256);
  for (size_t id = 0; id < token_keys.size(); ++id) {
    if (token_keys[id].empty()) continue;
    const int32_t sym = model->Intern(token_keys[id]);
    model->symbol_token_[sym] = static_cast<int32_t>(id);  // last one wins
  }
  for (int b = 0; b < 256; ++b) {
    model->byte_symbol_[b] =
        model->Intern(std::string(1, static_cast<char>(b)));
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    if (a.empty() || b.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " has an empty part"));
    }
    const std::string joined = a + b;
    if (options.require_merges_in_vocab) {
      for (const std::string* s : {&a, &b, &joined}) {
        auto it = model->symbol_of_.find(*s);
        if (it == model->symbol_of_.end() ||
            model->symbol_token_[it->second] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "merge ", rank, " ('", absl::CHexEscape(a), "' '",
              absl::CHexEscape(b), "') uses '", absl::CHexEscape(*s),
              "', which is not in the vocab"));
        }
      }
    }
    const int32_t left = model->Intern(a);
    const int32_t right = model->Intern(b);
    const int32_t result = model->Intern(joined);
    model->merges_.emplace(PairKey(left, right),
                           Merge{static_cast<int32_t>(rank), result});
  }
  return model;
}

int32_t BpeModel::Find(absl::string_view bytes) const {
  auto it = symbol_of_.find(std::string(bytes));
  return it == symbol_of_.end() ? -1 : symbol_token_[it->second];
}

void BpeModel::EmitSymbol(int32_t sym, std::vector<int32_t>* out) const {
  if (symbol_token_[sym] >= 0) {
    out->push_back(symbol_token_[sym]);
    return;
  }
  for (char c : symbol_bytes_[sym]) {
    const int32_t t = symbol_token_[byte_symbol_[static_cast<uint8_t>(c)]];
    if (t >= 0) out->push_back(t);
  }
}

void BpeModel::Encode(absl::string_view piece,
                      std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges || piece.size() == 1) {
    const int32_t t = Find(piece);
    if (t >= 0) {
      out->push_back(t);
      return;
    }
  }
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> sym(n), prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = byte_symbol_[static_cast<uint8_t>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate> queue(std::less<Candidate>(),
                                       std::move(storage));
  auto consider = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    const int32_t right = next[left];
    auto it = merges_.find(PairKey(sym[left], sym[right]));
    if (it != merges_.end()) {
      queue.push({it->second.rank, left, sym[left], sym[right]});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  std::vector<bool> alive(n, true);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const int32_t left = c.left;
    if (!alive[left] || sym[left] != c.left_sym) continue;
    const int32_t right = next[left];
    if (right < 0 || sym[right] != c.right_sym) continue;
    sym[left] = merges_.at(PairKey(c.left_sym, c.right_sym)).result;
    alive[right] = false;
    next[left] = next[right];
    if (next[left] >= 0) prev[next[left]] = left;
    consider(prev[left]);
    consider(left);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) EmitSymbol(sym[i], out);
}

}  // namespace baton
