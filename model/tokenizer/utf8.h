// UTF-8 helpers for the tokenizer: the lenient decoding that tokenization
// uses (compatible with llama.cpp), strict validation, and the incremental
// scanning that streaming detokenization needs.
#ifndef BATON_MODEL_TOKENIZER_UTF8_H_
#define BATON_MODEL_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace baton::utf8 {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Lenient decoding, as llama.cpp tokenizes: a lead byte 0xC0..0xF7 followed
// by enough bytes of the form 10xxxxxx decodes to the value of its payload
// bits, even when that is an overlong form, a surrogate or above U+10FFFF (up
// to 0x1FFFFF); every other byte (a lone continuation byte, a truncated
// sequence's lead, 0xF8..0xFF) becomes U+FFFD and decoding resumes at the
// next byte. Appends one codepoint per decoded unit to `cpts` and, when
// `byte_offsets` is not null, the byte offset where each unit starts.
void DecodeLenient(absl::string_view bytes, std::vector<uint32_t>* cpts,
                   std::vector<uint32_t>* byte_offsets = nullptr);

// Appends the 1..4 byte encoding of `cpt` (any value up to 0x1FFFFF, including
// surrogates, encoded by bit pattern). REQUIRES: cpt <= 0x1FFFFF.
void AppendEncoded(uint32_t cpt, std::string* out);

// Number of bytes AppendEncoded writes for `cpt`.
int EncodedLength(uint32_t cpt);

// Result of looking at the bytes at the start of a buffer under strict UTF-8
// rules (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
enum class SeqKind {
  kValid,       // `length` bytes form one valid character
  kIncomplete,  // all bytes are a valid prefix of a longer character
  kInvalid,     // the first `length` bytes are a maximal invalid subpart
};
struct Seq {
  SeqKind kind;
  // kValid: bytes of the character; kIncomplete: bytes present; kInvalid:
  // bytes of the maximal subpart (a valid prefix cut short, or 1).
  int length;
};
// REQUIRES: !bytes.empty().
Seq ScanOne(absl::string_view bytes);

// True if `bytes` is entirely valid UTF-8.
bool IsValid(absl::string_view bytes);

// Appends `bytes` to `out` with every maximal subpart of an ill-formed
// sequence replaced by one U+FFFD (Unicode's recommended practice, as Python
// and Rust's from_utf8_lossy do). When `keep_incomplete_tail` is true, an
// incomplete character at the very end is not written; the return value is
// the number of bytes consumed (bytes.size() minus that tail).
size_t AppendSanitized(absl::string_view bytes, bool keep_incomplete_tail,
                       std::string* out);

}  // namespace baton::utf8

#endif  // BATON_MODEL_TOKENIZER_UTF8_H_
