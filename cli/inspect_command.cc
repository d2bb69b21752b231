#include "cli/inspect_command.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/config/model_config.h"
#include "model/gguf/gguf_file.h"
#include "model/tensor.h"

namespace baton::cli {
namespace {

struct TensorRow {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

void PrintTensorTable(const std::vector<TensorRow>& rows, std::ostream& out) {
  size_t name_width = 4;
  for (const TensorRow& r : rows) name_width = std::max(name_width, r.name.size());
  out << absl::StrFormat("%-*s  %-5s  %-16s  %12s\n", name_width, "name", "type",
                         "shape", "bytes");
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  for (const TensorRow& r : rows) {
    out << absl::StrFormat("%-*s  %-5s  %-16s  %12d\n", name_width, r.name,
                           DTypeName(r.dtype), ShapeToString(r.shape), r.nbytes);
    total_bytes += r.nbytes;
    int64_t n = 1;
    for (int64_t d : r.shape) n *= d;
    total_elements += n;
  }
  out << absl::StrFormat("%d tensors, %d parameters, %d bytes (%.1f MiB)\n",
                         rows.size(), total_elements, total_bytes,
                         total_bytes / 1048576.0);
}

absl::Status InspectGguf(const InspectOptions& options, std::ostream& out) {
  BATON_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(options.model_path));
  out << "file:                " << options.model_path << "\n";
  out << absl::StrFormat("format:              GGUF v%d, alignment %d, %d bytes\n",
                         gguf->version(), gguf->alignment(), gguf->file_size());
  BATON_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(*gguf));
  out << config.DebugString();
  if (options.show_metadata) {
    out << "\nmetadata:\n";
    for (const auto& [key, value] : gguf->metadata()) {
      out << "  " << key << " = " << value.DebugString() << "\n";
    }
  }
  out << "\n";
  std::vector<TensorRow> rows;
  for (const GgufTensorInfo& t : gguf->tensors()) {
    rows.push_back({t.name, t.dtype, t.shape, t.nbytes});
  }
  PrintTensorTable(rows, out);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunInspect(const InspectOptions& options, std::ostream& out) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError("--model is required");
  }
  return InspectGguf(options, out);
}

}  // namespace baton::cli
