#include "model/safetensors/safetensors_file.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/safetensors/strict_json.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr absl::string_view kMetadataKey = "__metadata__";

struct SafetensorsDType {
  absl::string_view name;
  uint64_t bits;  // per element; F4 and F6_* pack below a byte
  std::optional<DType> dtype;
};

// Every dtype the safetensors format defines.
constexpr std::array<SafetensorsDType, 20> kDTypes = {{
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},
    {"I8", 8, std::nullopt},      {"F8_E5M2", 8, std::nullopt},
    {"F8_E4M3", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},
    {"F16", 16, DType::kF16},     {"BF16", 16, DType::kBF16},
    {"I32", 32, std::nullopt},    {"U32", 32, std::nullopt},
    {"F32", 32, DType::kF32},     {"F64", 64, std::nullopt},
    {"I64", 64, std::nullopt},    {"U64", 64, std::nullopt},
    {"C64", 64, std::nullopt},    {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
}};

const SafetensorsDType* FindDType(absl::string_view name) {
  for (const SafetensorsDType& t : kDTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A JSON number that must be a non-negative integer fitting in int64.
// `what` names it in errors ("dimension 1 of shape", "data_offsets[0]").
absl::StatusOr<uint64_t> NonNegativeInt(const Json& v, absl::string_view what) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x > kInt64Max) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is ", x, ", larger than 2^63-1"));
    }
    return x;
  }
  if (v.is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is negative (", v.get<int64_t>(), ")"));
  }
  if (v.is_number_float()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not an integer (", v.get<double>(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be an integer, got a JSON ", JsonTypeName(v)));
}

// The entry's member `key` of JSON type `type`, or an error naming both.
absl::StatusOr<const Json*> Member(const Json& entry, absl::string_view key,
                                   Json::value_t type,
                                   absl::string_view type_name) {
  auto it = entry.find(std::string(key));
  if (it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing \"", key, "\""));
  }
  if (it->type() != type) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be a JSON ", type_name,
                     ", got a JSON ", JsonTypeName(*it)));
  }
  return &*it;
}

// Validates one tensor entry against a data section of `data_size` bytes.
// Errors do not name the tensor; the caller prefixes it.
absl::StatusOr<SafetensorsTensorInfo> ParseTensor(const Json& entry,
                                                  uint64_t data_size) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "entry must be a JSON object, got a JSON ", JsonTypeName(entry)));
  }
  BATON_ASSIGN_OR_RETURN(
      const Json* dtype_json,
      Member(entry, "dtype", Json::value_t::string, "string"));
  BATON_ASSIGN_OR_RETURN(const Json* shape_json,
                         Member(entry, "shape", Json::value_t::array, "array"));
  BATON_ASSIGN_OR_RETURN(
      const Json* offsets_json,
      Member(entry, "data_offsets", Json::value_t::array, "array"));

  const std::string& dtype_name = dtype_json->get_ref<const std::string&>();
  const SafetensorsDType* dtype = FindDType(dtype_name);
  if (dtype == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype \"", dtype_name.substr(0, 64), "\""));
  }

  SafetensorsTensorInfo info;
  info.dtype_name = dtype->name;
  info.dtype = dtype->dtype;
  info.shape.reserve(shape_json->size());
  // The product of the non-zero dimensions must fit, so that a 0 anywhere
  // does not let later code multiply huge dimensions unchecked.
  uint64_t nonzero = 1;
  bool any_zero = false;
  for (size_t i = 0; i < shape_json->size(); ++i) {
    BATON_ASSIGN_OR_RETURN(
        uint64_t d,
        NonNegativeInt((*shape_json)[i], absl::StrCat("shape[", i, "]")));
    info.shape.push_back(static_cast<int64_t>(d));
    if (d == 0) {
      any_zero = true;
    } else if (nonzero > kInt64Max / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(info.shape),
          "...: product of the non-zero dimensions overflows int64"));
    }
    if (d != 0) nonzero *= d;
  }
  const uint64_t elements = any_zero ? 0 : nonzero;
  if (dtype->bits % 8 == 0) {
    const uint64_t width = dtype->bits / 8;
    if (nonzero > kInt64Max / width) {
      return absl::InvalidArgumentError(
          absl::StrCat("byte count of ", dtype->name, " shape ",
                       ShapeToString(info.shape), " overflows int64"));
    }
    info.nbytes = elements * width;
  } else {
    // F4 / F6_*: elements pack across bytes and must fill whole bytes.
    if ((elements % 8) * dtype->bits % 8 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          dtype->name, " shape ", ShapeToString(info.shape), " has ", elements,
          " elements of ", dtype->bits, " bits, not a whole number of bytes"));
    }
    info.nbytes = elements / 8 * dtype->bits + (elements % 8) * dtype->bits / 8;
  }

  if (offsets_json->size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"data_offsets\" must hold 2 integers [begin, end], got ",
                     offsets_json->size()));
  }
  BATON_ASSIGN_OR_RETURN(uint64_t begin,
                         NonNegativeInt((*offsets_json)[0], "data_offsets[0]"));
  BATON_ASSIGN_OR_RETURN(uint64_t end,
                         NonNegativeInt((*offsets_json)[1], "data_offsets[1]"));
  if (begin > end) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end, "] have begin > end"));
  }
  if (end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end,
                     "] end past the data section of ", data_size, " bytes"));
  }
  if (end - begin != info.nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end, "] span ", end - begin,
                     " bytes, but ", dtype->name, " shape ",
                     ShapeToString(info.shape), " needs ", info.nbytes));
  }
  info.offset = begin;  // relative for now; the caller adds data_offset()
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped,
                         MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->bytes_ = mapped->bytes();
  file->path_ = path;
  file->file_ = std::move(mapped);
  BATON_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    std::span<const uint8_t> bytes) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->bytes_ = bytes;
  BATON_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

std::string SafetensorsFile::Describe() const {
  return path_.empty() ? std::string("safetensors buffer")
                       : absl::StrCat("safetensors file '", path_, "'");
}

absl::Status SafetensorsFile::ParseAll() {
  const uint64_t size = bytes_.size();
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(), ": file is ", size,
        " bytes, shorter than the 8-byte header length at offset 0"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[i];
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(), ": header length ", n, " at offset 0 exceeds the limit of ",
        kMaxHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(), ": header length ", n, " at offset 0 is larger than the ",
        size - 8, " bytes after it"));
  }
  header_size_ = n;
  const uint64_t data_size = size - 8 - n;

  absl::string_view text(reinterpret_cast<const char*>(bytes_.data() + 8), n);
  Json header;
  BATON_RETURN_IF_ERROR(ParseStrictJson(
      text, absl::StrCat(Describe(), ": header"), /*base_offset=*/8, &header));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(), ": header must be a JSON object, got a JSON ",
                     JsonTypeName(header)));
  }

  tensors_.reserve(header.size());
  // nlohmann's object is a std::map: iteration is sorted by name, so tensors_
  // comes out sorted.
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(), ": \"__metadata__\" must be a JSON object, got a JSON ",
            JsonTypeName(entry)));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(), ": \"__metadata__\" value of \"", key,
              "\" must be a JSON string, got a JSON ", JsonTypeName(value)));
        }
        metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensorInfo> info = ParseTensor(entry, data_size);
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat(Describe(), ": tensor '", name,
                                       "': ", info.status().message()));
    }
    info->name = name;
    info->offset += data_offset();
    tensors_.push_back(*std::move(info));
  }
  return absl::OkStatus();
}

const std::string* SafetensorsFile::FindMetadata(absl::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const SafetensorsTensorInfo* SafetensorsFile::FindTensor(
    absl::string_view name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const SafetensorsTensorInfo& t, absl::string_view n) {
                         return absl::string_view(t.name) < n;
                       });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<TensorView> SafetensorsFile::View(
    const SafetensorsTensorInfo& info) const {
  if (!info.dtype.has_value()) {
    return absl::UnimplementedError(absl::StrCat(
        Describe(), ": tensor '", info.name, "' has dtype ", info.dtype_name,
        "; Baton reads only F32, F16 and BF16 safetensors tensors"));
  }
  TensorView view;
  view.name = info.name;
  view.dtype = *info.dtype;
  view.shape = info.shape;
  view.data = bytes_.data() + info.offset;
  view.nbytes = info.nbytes;
  return view;
}

absl::StatusOr<TensorView> SafetensorsFile::GetTensor(
    absl::string_view name) const {
  const SafetensorsTensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(Describe(), ": no tensor named '", name, "'"));
  }
  return View(*info);
}

}  // namespace baton
