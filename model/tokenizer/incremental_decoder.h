// Streaming detokenization: turns a stream of token ids into text pieces that
// are always valid UTF-8 and never split a character, for sending to clients
// token by token.
//
// For ids whose concatenated bytes are valid UTF-8, the concatenation of all
// Push() results and Finish() equals Tokenizer::Decode(ids); in general it
// equals Decode(ids) with each maximal ill-formed subpart replaced by U+FFFD
// (utf8::AppendSanitized). Such bytes come out as soon as they are certain to
// be invalid; an incomplete character at the end is held back until a later
// token completes it, or Finish() turns it into one U+FFFD.
#ifndef BATON_MODEL_TOKENIZER_INCREMENTAL_DECODER_H_
#define BATON_MODEL_TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <string>

#include "model/tokenizer/tokenizer.h"

namespace baton {

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive this decoder. skip_special: as in Decode.
  explicit IncrementalDecoder(const Tokenizer& tokenizer,
                              bool skip_special = false);

  IncrementalDecoder(const IncrementalDecoder&) = delete;
  IncrementalDecoder& operator=(const IncrementalDecoder&) = delete;

  // Adds one token; returns the text that is now complete (maybe empty).
  std::string Push(int32_t id);
  // Returns whatever is held back, an incomplete tail as U+FFFD per byte, and
  // resets the decoder for a new stream.
  std::string Finish();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_INCREMENTAL_DECODER_H_
