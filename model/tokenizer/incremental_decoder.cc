#include "model/tokenizer/incremental_decoder.h"

#include "model/tokenizer/utf8.h"

namespace baton {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer,
                                       bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return "";
  pending_ += tokenizer_.TokenToBytes(id);
  std::string out;
  const size_t used =
      utf8::AppendSanitized(pending_, /*keep_incomplete_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::Finish() {
  std::string out;
  utf8::AppendSanitized(pending_, /*keep_incomplete_tail=*/false, &out);
  pending_.clear();
  return out;
}

}  // namespace baton
