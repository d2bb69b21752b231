#include "common/grpc/grpc_status.h"

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

std::optional<absl::Duration> ParseMs(absl::string_view text) {
  int64_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::optional<absl::Duration> RetryAfterFrom(const grpc::ClientContext& call) {
  const auto& trailers = call.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryAfterMsKey);
  if (it == trailers.end()) return std::nullopt;
  return ParseMs(absl::string_view(it->second.data(), it->second.size()));
}

void SetRetryAfter(absl::Status& status, absl::Duration delay) {
  if (status.ok()) return;
  status.SetPayload(kRetryAfterPayload,
                    absl::Cord(absl::StrCat(absl::ToInt64Milliseconds(delay))));
}

std::optional<absl::Duration> RetryAfterOf(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayload);
  if (!payload.has_value()) return std::nullopt;
  return ParseMs(std::string(*payload));
}

}  // namespace baton
