// Shared pieces of the multi-process cluster tests: running a Generate
// stream to its end (optionally cancelling it), and the reference answers of
// an in-process engine for the same requests.
#ifndef BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
#define BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"

namespace baton::testing {

// What one Generate stream delivered.
struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  int messages = 0;
  bool has_result = false;
  v1::GenerateResult result;
};

struct StreamOptions {
  absl::Duration deadline = absl::Seconds(120);
  // Cancel the RPC (TryCancel) once this many tokens arrived; -1: never.
  int cancel_after_tokens = -1;
};

StreamResult RunGenerate(v1::Baton::Stub& stub,
                         const v1::GenerateRequest& request,
                         const StreamOptions& options = {});

// One chat prompt with sampling parameters; `seed` always set.
v1::GenerateRequest ChatRequest(const std::string& user, int max_tokens,
                                double temperature, uint64_t seed);

// The tokens, text and finish reason an in-process engine with the default
// model gives for each request (all submitted together, one batch), with
// prompts tokenized as the coordinator does.
struct Expected {
  std::vector<int32_t> tokens;
  std::string text;
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
};
std::vector<Expected> InProcessReference(
    const std::vector<v1::GenerateRequest>& requests);

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
