// baton-worker --device: where the engine computes.
#ifndef BATON_WORKER_SERVICE_DEVICE_FLAG_H_
#define BATON_WORKER_SERVICE_DEVICE_FLAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU

  std::string ToString() const;
};

// "cpu", "cuda" (device 0) or "cuda:N" with N a decimal ordinal in
// [0, 1023]. InvalidArgument quoting the text and the accepted forms
// otherwise.
absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text);

}  // namespace baton

#endif  // BATON_WORKER_SERVICE_DEVICE_FLAG_H_
