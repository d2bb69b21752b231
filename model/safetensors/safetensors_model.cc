#include "model/safetensors/safetensors_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "model/safetensors/strict_json.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";

std::string DirectoryOf(const std::string& file_path) {
  std::string dir = fs::path(file_path).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

bool IsRegularFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// A weight_map shard must be a plain file name inside the index's directory.
absl::Status ValidateShardName(absl::string_view shard,
                               absl::string_view tensor) {
  absl::string_view problem;
  if (shard.empty()) {
    problem = "is empty";
  } else if (absl::StrContains(shard, '/') || absl::StrContains(shard, '\\')) {
    problem = "contains a path separator";
  } else if (absl::StrContains(shard, "..")) {
    problem = "contains \"..\"";
  } else if (absl::StrContains(shard, absl::string_view("\0", 1))) {
    problem = "contains a NUL byte";
  }
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "weight_map shard file name \"", shard, "\" for tensor '", tensor, "' ",
      problem, "; it must name a file beside the index"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(
    const std::string& path) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    model->directory_ = path;
    std::string single = (fs::path(path) / kSingleFileName).string();
    std::string index = (fs::path(path) / kIndexFileName).string();
    if (IsRegularFile(single)) {
      BATON_RETURN_IF_ERROR(model->LoadSingle(single));
    } else if (IsRegularFile(index)) {
      BATON_RETURN_IF_ERROR(model->LoadIndex(index));
    } else {
      return absl::NotFoundError(
          absl::StrCat("directory '", path, "' holds neither ", kSingleFileName,
                       " nor ", kIndexFileName));
    }
    return model;
  }
  model->directory_ = DirectoryOf(path);
  if (absl::EndsWith(path, ".json")) {
    BATON_RETURN_IF_ERROR(model->LoadIndex(path));
  } else {
    BATON_RETURN_IF_ERROR(model->LoadSingle(path));
  }
  return model;
}

std::string SafetensorsModel::config_json_path() const {
  return (fs::path(directory_) / "config.json").string();
}

absl::Status SafetensorsModel::LoadSingle(const std::string& file_path) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(file_path));
  shards_.push_back(std::move(file));
  return CollectTensors({file_path});
}

absl::Status SafetensorsModel::LoadIndex(const std::string& index_path) {
  index_path_ = index_path;
  const std::string what = absl::StrCat("safetensors index '", index_path, "'");
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped,
                         MappedFile::Open(index_path));
  if (mapped->size() > kMaxIndexBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", mapped->size(), " bytes exceeds the limit of ",
                     kMaxIndexBytes));
  }
  Json index;
  BATON_RETURN_IF_ERROR(ParseStrictJson(
      absl::string_view(reinterpret_cast<const char*>(mapped->data()),
                        mapped->size()),
      what, /*base_offset=*/0, &index));
  if (!index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": must be a JSON object, got a JSON ", JsonTypeName(index)));
  }
  if (auto it = index.find("metadata"); it != index.end() && !it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"metadata\" must be a JSON object, got a JSON ",
                     JsonTypeName(*it)));
  }
  auto weight_map_it = index.find("weight_map");
  if (weight_map_it == index.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": missing \"weight_map\""));
  }
  const Json& weight_map = *weight_map_it;
  if (!weight_map.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": \"weight_map\" must be a JSON object, got a JSON ",
        JsonTypeName(weight_map)));
  }

  // Shard file name -> index into shards_, assigned in sorted order.
  std::map<std::string, size_t> shard_ids;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": weight_map value for tensor '", tensor,
          "' must be a JSON string, got a JSON ", JsonTypeName(shard)));
    }
    const std::string& name = shard.get_ref<const std::string&>();
    absl::Status valid = ValidateShardName(name, tensor);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", valid.message()));
    }
    shard_ids.emplace(name, 0);
  }
  std::vector<std::string> shard_names;
  for (auto& [name, id] : shard_ids) {
    id = shard_names.size();
    shard_names.push_back(name);
    std::string shard_path = (fs::path(directory_) / name).string();
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(shard_path);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(what, ": cannot load shard '", name,
                       "' named by weight_map: ", file.status().message()));
    }
    shards_.push_back(*std::move(file));
  }
  if (absl::Status s = CollectTensors(shard_names); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }

  for (const auto& [tensor, shard] : weight_map.items()) {
    const std::string& name = shard.get_ref<const std::string&>();
    const SafetensorsModelTensor* found = FindTensor(tensor);
    if (found == nullptr || shard_names[found->shard] != name) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": weight_map lists tensor '", tensor, "' in shard '", name,
          "', which has no such tensor",
          found == nullptr ? std::string()
                           : absl::StrCat(" (it is in shard '",
                                          shard_names[found->shard], "')")));
    }
  }
  if (tensors_.size() != weight_map.size()) {
    for (const SafetensorsModelTensor& t : tensors_) {
      if (!weight_map.contains(t.info->name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": tensor '", t.info->name, "' of shard '",
            shard_names[t.shard], "' is not listed in weight_map"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsModel::CollectTensors(
    const std::vector<std::string>& shard_names) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    for (const SafetensorsTensorInfo& info : shards_[i]->tensors()) {
      tensors_.push_back({&info, i});
    }
  }
  std::stable_sort(
      tensors_.begin(), tensors_.end(),
      [](const SafetensorsModelTensor& a, const SafetensorsModelTensor& b) {
        return a.info->name < b.info->name;
      });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    if (tensors_[i].info->name == tensors_[i - 1].info->name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensors_[i].info->name, "' is in both shard '",
          shard_names[tensors_[i - 1].shard], "' and shard '",
          shard_names[tensors_[i].shard], "'"));
    }
  }
  return absl::OkStatus();
}

const SafetensorsModelTensor* SafetensorsModel::FindTensor(
    absl::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const SafetensorsModelTensor& t, absl::string_view n) {
        return absl::string_view(t.info->name) < n;
      });
  if (it == tensors_.end() || it->info->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<TensorView> SafetensorsModel::GetTensor(
    absl::string_view name) const {
  const SafetensorsModelTensor* t = FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("safetensors model in '",
                                            directory_, "': no tensor named '",
                                            name, "'"));
  }
  return shards_[t->shard]->View(*t->info);
}

}  // namespace baton
