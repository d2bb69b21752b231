// Token kinds, numbered as GGUF's tokenizer.ggml.token_type.
#ifndef BATON_MODEL_TOKENIZER_TOKEN_TYPES_H_
#define BATON_MODEL_TOKENIZER_TOKEN_TYPES_H_

#include <cstdint>

namespace baton {

enum class TokenType : uint8_t {
  kNormal = 1,       // byte-level text, produced by BPE
  kUnknown = 2,      // special: the unknown token
  kControl = 3,      // special: <|im_start|>, <|eot_id|>, ...
  kUserDefined = 4,  // added token matched as-is in any text, decodes as-is
  kUnused = 5,       // never produced, decodes to nothing
  kByte = 6,         // treated as kNormal by byte-level BPE
};

}  // namespace baton

#endif  // BATON_MODEL_TOKENIZER_TOKEN_TYPES_H_
