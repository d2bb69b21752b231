// GgufValue, GgufArray element access and GgufFile's typed metadata and
// tensor getters; the parser is in gguf_file.cc.
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "model/gguf/gguf_file.h"

namespace baton {
namespace {

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

absl::string_view GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

absl::string_view GgufArray::GetString(size_t i) const {
  BATON_CHECK(element_type_ == GgufType::kString);
  BATON_CHECK_LT(i, count_);
  const uint8_t* p = data_ + offsets_[i];
  return absl::string_view(reinterpret_cast<const char*>(p + 8), LoadU64(p));
}

absl::StatusOr<int64_t> GgufValue::AsInt() const {
  switch (type()) {
    case GgufType::kUint8:
      return std::get<uint8_t>(value);
    case GgufType::kInt8:
      return std::get<int8_t>(value);
    case GgufType::kUint16:
      return std::get<uint16_t>(value);
    case GgufType::kInt16:
      return std::get<int16_t>(value);
    case GgufType::kUint32:
      return std::get<uint32_t>(value);
    case GgufType::kInt32:
      return std::get<int32_t>(value);
    case GgufType::kInt64:
      return std::get<int64_t>(value);
    case GgufType::kUint64: {
      uint64_t v = std::get<uint64_t>(value);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::OutOfRangeError(
            absl::StrCat("value ", v, " exceeds int64"));
      }
      return static_cast<int64_t>(v);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("expected an integer, got ", GgufTypeName(type())));
  }
}

absl::StatusOr<double> GgufValue::AsFloat() const {
  if (type() == GgufType::kFloat32) return std::get<float>(value);
  if (type() == GgufType::kFloat64) return std::get<double>(value);
  auto i = AsInt();
  if (i.ok()) return static_cast<double>(*i);
  return absl::InvalidArgumentError(
      absl::StrCat("expected a number, got ", GgufTypeName(type())));
}

std::string GgufValue::DebugString() const {
  switch (type()) {
    case GgufType::kString: {
      absl::string_view s = std::get<absl::string_view>(value);
      if (s.size() > 60) return absl::StrCat("\"", s.substr(0, 57), "...\"");
      return absl::StrCat("\"", s, "\"");
    }
    case GgufType::kArray: {
      const GgufArray& a = std::get<GgufArray>(value);
      std::string out =
          absl::StrCat(GgufTypeName(a.element_type()), "[", a.size(), "]");
      if (a.element_type() != GgufType::kArray && a.size() > 0) {
        absl::StrAppend(&out, " {");
        for (size_t i = 0; i < a.size() && i < 4; ++i) {
          absl::StrAppend(&out, i ? ", " : "", a.Get(i).DebugString());
        }
        absl::StrAppend(&out, a.size() > 4 ? ", ...}" : "}");
      }
      return out;
    }
    case GgufType::kBool:
      return std::get<bool>(value) ? "true" : "false";
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      return absl::StrFormat("%g", *AsFloat());
    default: {
      if (type() == GgufType::kUint64) {
        return absl::StrCat(std::get<uint64_t>(value));
      }
      return absl::StrCat(*AsInt());
    }
  }
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

namespace {

absl::Status WrongType(absl::string_view key, absl::string_view expected,
                       GgufType actual) {
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata '", key, "' should be ", expected,
                   ", but is ", GgufTypeName(actual)));
}

absl::Status Missing(absl::string_view key) {
  return absl::NotFoundError(
      absl::StrCat("GGUF metadata '", key, "' is missing"));
}

}  // namespace

absl::StatusOr<absl::string_view> GgufFile::GetString(
    absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type() != GgufType::kString)
    return WrongType(key, "a string", v->type());
  return std::get<absl::string_view>(v->value);
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  auto i = v->AsInt();
  if (!i.ok()) return WrongType(key, "an integer", v->type());
  return *i;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  auto f = v->AsFloat();
  if (!f.ok()) return WrongType(key, "a number", v->type());
  return *f;
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type() != GgufType::kBool) return WrongType(key, "a bool", v->type());
  return std::get<bool>(v->value);
}

absl::StatusOr<int64_t> GgufFile::GetIntOr(absl::string_view key,
                                           int64_t fallback) const {
  return Find(key) == nullptr ? fallback : GetInt(key);
}

absl::StatusOr<double> GgufFile::GetFloatOr(absl::string_view key,
                                            double fallback) const {
  return Find(key) == nullptr ? fallback : GetFloat(key);
}

absl::StatusOr<bool> GgufFile::GetBoolOr(absl::string_view key,
                                         bool fallback) const {
  return Find(key) == nullptr ? fallback : GetBool(key);
}

absl::StatusOr<const GgufArray*> GgufFile::GetArray(
    absl::string_view key, GgufType element_type) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(key);
  if (v->type() != GgufType::kArray) {
    return WrongType(key,
                     absl::StrCat("an array of ", GgufTypeName(element_type)),
                     v->type());
  }
  const GgufArray& a = std::get<GgufArray>(v->value);
  if (a.element_type() != element_type) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF metadata '", key, "' should be an array of ",
                     GgufTypeName(element_type), ", but its elements are ",
                     GgufTypeName(a.element_type())));
  }
  return &a;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

TensorView GgufFile::View(const GgufTensorInfo& info) const {
  return TensorView{info.name, info.dtype, info.shape,
                    bytes_.data() + info.offset, info.nbytes};
}

absl::StatusOr<TensorView> GgufFile::GetTensor(absl::string_view name) const {
  const GgufTensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("GGUF file has no tensor named '", name, "'"));
  }
  return View(*info);
}

}  // namespace baton
