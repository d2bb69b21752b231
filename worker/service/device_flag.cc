#include "worker/service/device_flag.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

absl::StatusOr<DeviceSpec> ParseDevice(absl::string_view text) {
  auto bad = [text](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", text, "' ", why,
                     "; use cpu, cuda or cuda:N (N = 0, 1, ...)"));
  };
  DeviceSpec spec;
  if (text == "cpu") return spec;
  spec.kind = DeviceSpec::Kind::kCuda;
  if (text == "cuda") return spec;
  if (!absl::StartsWith(text, "cuda:")) return bad("names no known device");
  const absl::string_view ordinal = text.substr(5);
  if (ordinal.empty() || ordinal.size() > 4) {
    return bad("has no device ordinal in [0, 1023]");
  }
  for (char c : ordinal) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return bad("has no device ordinal in [0, 1023]");
    }
  }
  int index = 0;
  if (!absl::SimpleAtoi(ordinal, &index) || index > 1023) {
    return bad("has no device ordinal in [0, 1023]");
  }
  spec.index = index;
  return spec;
}

}  // namespace baton
