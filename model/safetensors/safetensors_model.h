// A Hugging Face model's weights in safetensors form: one `model.safetensors`
// or shards listed by `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {"tensor name": "shard file name"}}).
// Each shard is mapped once and validated by SafetensorsFile.
//
// The index and the shards must agree exactly: every weight_map entry names
// a shard file in the index's directory (a plain file name: no '/', '\' or
// "..") that holds the tensor, every tensor of every listed shard is in the
// weight_map under that shard, and no tensor is in two shards. Violations are
// InvalidArgument naming the tensor and the shard; a missing shard file is
// NotFound naming it.
#ifndef BATON_MODEL_SAFETENSORS_SAFETENSORS_MODEL_H_
#define BATON_MODEL_SAFETENSORS_SAFETENSORS_MODEL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/safetensors/safetensors_file.h"
#include "model/tensor.h"

namespace baton {

struct SafetensorsModelTensor {
  const SafetensorsTensorInfo* info;  // name, dtype, shape; owned by the shard
  size_t shard;                       // index for SafetensorsModel::shard()
};

class SafetensorsModel {
 public:
  // Index file limit (real indexes are well under 1 MiB).
  static constexpr uint64_t kMaxIndexBytes = uint64_t{100} << 20;

  // `path` is one of:
  //   - a directory holding model.safetensors (preferred when both exist, as
  //     in transformers) or model.safetensors.index.json;
  //   - a path ending in ".json": an index file;
  //   - any other file: a single .safetensors file.
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(
      const std::string& path);

  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  // The directory holding the weights ("." for a bare relative file name).
  const std::string& directory() const { return directory_; }
  // directory()/config.json; may not exist.
  std::string config_json_path() const;
  // The index file, or empty for a single-file model.
  const std::string& index_path() const { return index_path_; }

  // Shards sorted by file name; a single-file model has one.
  size_t num_shards() const { return shards_.size(); }
  // REQUIRES: i < num_shards().
  const SafetensorsFile& shard(size_t i) const { return *shards_[i]; }

  // All tensors of all shards, sorted by name (byte-wise).
  const std::vector<SafetensorsModelTensor>& tensors() const {
    return tensors_;
  }
  // nullptr when absent.
  const SafetensorsModelTensor* FindTensor(absl::string_view name) const;
  // NotFound naming the tensor; Unimplemented for a dtype other than F32,
  // F16 and BF16 (see SafetensorsFile::View).
  absl::StatusOr<TensorView> GetTensor(absl::string_view name) const;

 private:
  SafetensorsModel() = default;
  absl::Status LoadSingle(const std::string& file_path);
  absl::Status LoadIndex(const std::string& index_path);
  // Fills tensors_ from shards_; InvalidArgument for a tensor in two shards.
  absl::Status CollectTensors(const std::vector<std::string>& shard_names);

  std::string directory_;
  std::string index_path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<SafetensorsModelTensor> tensors_;
};

}  // namespace baton

#endif  // BATON_MODEL_SAFETENSORS_SAFETENSORS_MODEL_H_
