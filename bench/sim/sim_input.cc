// Checks of baton-sim's input: the shape, the options and the requests.
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/sim/prefix_model.h"
#include "bench/sim/simulator.h"

namespace baton::sim {

absl::Status ParseShape(const std::string& shape, SimOptions* options) {
  options->prefill = options->decode = options->both = 0;
  size_t i = 0;
  bool any = false;
  while (i < shape.size()) {
    size_t j = i;
    while (j < shape.size() && shape[j] >= '0' && shape[j] <= '9') ++j;
    int count = 0;
    if (j == i || j == shape.size() ||
        !absl::SimpleAtoi(shape.substr(i, j - i), &count) || count <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape '", shape, "': want counts and roles, e.g. 1P1D, 2C, 4P12D"));
    }
    switch (shape[j]) {
      case 'P':
        options->prefill += count;
        break;
      case 'D':
        options->decode += count;
        break;
      case 'C':
        options->both += count;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("shape '", shape, "': role '",
                         std::string(1, shape[j]), "' is not P, D or C"));
    }
    any = true;
    i = j + 1;
  }
  if (!any) {
    return absl::InvalidArgumentError("shape: empty (e.g. 1P1D, 2C)");
  }
  return absl::OkStatus();
}

absl::Status ValidateSimInput(const SimOptions& options,
                              const std::vector<SimRequest>& requests) {
  if (options.prefill < 0 || options.decode < 0 || options.both < 0 ||
      (options.prefill > 0) != (options.decode > 0) ||
      (options.prefill > 0 && options.both > 0) ||
      (options.prefill == 0 && options.both == 0)) {
    return absl::InvalidArgumentError(
        "shape: prefill and decode workers together (split serving) or "
        "colocated workers alone");
  }
  if (absl::Status s = coordinator::ValidateAdmissionOptions(options.admission);
      !s.ok()) {
    return s;
  }
  if (options.local_prefill_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_prefill_tokens must be >= 0 (0: always split), "
                     "got ",
                     options.local_prefill_tokens));
  }
  if (options.workers_per_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workers_per_host must be >= 1, got ", options.workers_per_host));
  }
  if (options.piece_tokens <= 0 ||
      options.piece_tokens % options.profile.block_size != 0 ||
      options.piece_tokens / options.profile.block_size > kMaxBlocksPerPiece) {
    return absl::InvalidArgumentError(
        absl::StrCat("piece_tokens ", options.piece_tokens,
                     " must be a positive multiple of the block size (",
                     options.profile.block_size, "), at most ",
                     kMaxBlocksPerPiece, " blocks"));
  }
  const int64_t largest =
      options.profile.kv_blocks * options.profile.block_size;
  double previous = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimRequest& r = requests[i];
    if (r.input_len < 1 || r.output_len < 1 || !(r.arrival_s >= previous)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": lengths must be >= 1 and arrivals ascending"));
    }
    if (r.input_len + r.output_len > largest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": ", r.input_len, " + ", r.output_len,
          " tokens exceed a worker's KV pool (", largest, " tokens)"));
    }
    for (const int64_t id : r.piece_ids) {
      if (id < 0 || id > kMaxPieceId) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", i, ": piece (hash) id ", id,
                         " is outside [0, ", kMaxPieceId, "]"));
      }
    }
    previous = r.arrival_s;
  }
  return absl::OkStatus();
}

}  // namespace baton::sim
