// The GPT-2 byte-level alphabet: a bijection between the 256 byte values and
// 256 printable Unicode codepoints, so that byte-level BPE vocabularies can be
// stored as text. Bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF map to the
// codepoint of the same value; the other 68 bytes map, in increasing order,
// to U+0100, U+0101, ...
#ifndef BATON_MODEL_TOKENIZER_BYTE_LEVEL_H_
#define BATON_MODEL_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace baton::byte_level {

// The codepoint that stands for byte `b`.
uint32_t ByteToCodepoint(uint8_t b);

// The byte that `cpt` stands for, or -1 if `cpt` is not in the alphabet.
int CodepointToByte(uint32_t cpt);

// Raw bytes -> byte-level text (UTF-8).
std::string Encode(absl::string_view bytes);

// Byte-level text -> raw bytes. Characters outside the alphabet (or invalid
// UTF-8) are copied through unchanged; returns false if there were any.
bool Decode(absl::string_view text, std::string* bytes);

}  // namespace baton::byte_level

#endif  // BATON_MODEL_TOKENIZER_BYTE_LEVEL_H_
