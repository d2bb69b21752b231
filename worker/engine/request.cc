#include "worker/engine/request.h"

namespace baton {
namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

double RequestMetrics::ttft_s() const { return Seconds(first_token - arrival); }

double RequestMetrics::queue_s() const {
  return Seconds(first_scheduled - arrival);
}

double RequestMetrics::decode_tokens_per_s() const {
  const double s = Seconds(finished - first_token);
  return generated_tokens > 1 && s > 0 ? (generated_tokens - 1) / s : 0.0;
}

}  // namespace baton
