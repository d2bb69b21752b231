// JSON parsing for untrusted model headers and index files: nlohmann::json
// without exceptions, plus the checks nlohmann skips.
#ifndef BATON_MODEL_SAFETENSORS_STRICT_JSON_H_
#define BATON_MODEL_SAFETENSORS_STRICT_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace baton {

// Nesting limit for ParseStrictJson; safetensors headers and index files nest
// at most three levels.
inline constexpr int kMaxStrictJsonDepth = 32;

// Parses `text` (one JSON value, optionally surrounded by whitespace) into
// *out. Unlike nlohmann::json::parse, which keeps the last of duplicate keys,
// a key repeated within one object is an error, and so is nesting deeper than
// kMaxStrictJsonDepth. Errors are InvalidArgument and start with `what`:
// a syntax error names its byte offset, counted as `base_offset` + offset in
// `text` (so a caller can report offsets in the enclosing file); a duplicate
// key names the key and the JSON pointer of its object. Never throws.
absl::Status ParseStrictJson(absl::string_view text, absl::string_view what,
                             uint64_t base_offset, nlohmann::json* out);

// "object", "array", "string", "integer", "number", "boolean", "null".
absl::string_view JsonTypeName(const nlohmann::json& value);

}  // namespace baton

#endif  // BATON_MODEL_SAFETENSORS_STRICT_JSON_H_
