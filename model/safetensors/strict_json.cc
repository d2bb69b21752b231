#include "model/safetensors/strict_json.h"

#include <cstddef>
#include <exception>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

using Json = nlohmann::json;

// A SAX pass that parses nothing into memory except the keys of the objects
// currently open, to find duplicates and excessive nesting before the DOM
// parse (which would silently keep the last duplicate).
class StrictChecker {
 public:
  explicit StrictChecker(uint64_t base_offset) : base_offset_(base_offset) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(Json::number_integer_t) { return Value(); }
  bool number_unsigned(Json::number_unsigned_t) { return Value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) {
    return Value();
  }
  bool string(Json::string_t&) { return Value(); }
  bool binary(Json::binary_t&) { return Value(); }

  bool start_object(std::size_t) { return Open(/*is_object=*/true); }
  bool start_array(std::size_t) { return Open(/*is_object=*/false); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(Json::string_t& key) {
    Frame& top = frames_.back();
    if (!top.keys.insert(key).second) {
      error_ = absl::StrCat("duplicate key \"", key, "\" in the object at ",
                            Pointer());
      return false;
    }
    top.last_key = key;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) {
    // nlohmann counts the character that failed, so the offending byte sits
    // at position - 1.
    error_ =
        absl::StrCat("malformed JSON at byte offset ",
                     base_offset_ + (position == 0 ? 0 : position - 1),
                     " near '", last_token.substr(0, 40), "': ", ex.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;  // objects only
    std::string last_key;        // objects only
    size_t count = 0;            // arrays only: elements seen so far
  };

  // Called for every value, before it is consumed; advances array indices.
  void Element() {
    if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().count;
  }
  bool Value() {
    Element();
    return true;
  }
  bool Open(bool is_object) {
    Element();
    if (frames_.size() >= static_cast<size_t>(kMaxStrictJsonDepth)) {
      error_ = absl::StrCat("JSON nests deeper than ", kMaxStrictJsonDepth,
                            " levels at ", Pointer());
      return false;
    }
    frames_.push_back(Frame{is_object, {}, {}, 0});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }

  // JSON pointer of the innermost open container, e.g. "/weight_map" or
  // "/a/3"; "the top level" for the outermost one.
  std::string Pointer() const {
    std::string p;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      absl::StrAppend(&p, "/",
                      f.is_object ? f.last_key : absl::StrCat(f.count - 1));
    }
    return p.empty() ? "the top level" : absl::StrCat("\"", p, "\"");
  }

  uint64_t base_offset_;
  std::vector<Frame> frames_;
  std::string error_;
};

}  // namespace

absl::Status ParseStrictJson(absl::string_view text, absl::string_view what,
                             uint64_t base_offset, nlohmann::json* out) {
  try {
    StrictChecker checker(base_offset);
    if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
      std::string error = checker.error().empty() ? std::string("invalid JSON")
                                                  : checker.error();
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", error));
    }
    *out = Json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
    if (out->is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": malformed JSON"));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": out of memory parsing ", text.size(), " bytes of JSON"));
  } catch (const std::exception& e) {
    // nlohmann reports through the SAX handler and allow_exceptions=false;
    // this only guards allocation failure and library surprises.
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot parse JSON: ", e.what()));
  }
  return absl::OkStatus();
}

absl::string_view JsonTypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::null:
      return "null";
    default:
      return "binary";
  }
}

}  // namespace baton
