// Shared pieces of the multi-process cluster tests: running a Generate
// stream to its end (optionally cancelling it), and the reference answers of
// an in-process engine for the same requests.
#ifndef BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
#define BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <optional>
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
  // The retry delay a refusal's trailing metadata carried (RetryAfterFrom).
  std::optional<absl::Duration> retry_after;
};

// How a stream ended, for assertion messages: the RPC status, the finish
// reason with the in-band error, and the token count.
std::string Describe(const StreamResult& result);

// How long this host, in this build, takes for a fixed piece of engine
// work (a 32-token prefill and 4 decode steps on one thread, in process),
// measured once per test process. Client deadlines are sized from it,
// never from a figure taken on another host.
absl::Duration HostPace();
// The deadline of a test request that should finish long before it: 60 s
// plus 200 paces (a test's request is a few paces of work per process,
// plus RPC hops). It only stops a hang.
absl::Duration DefaultTestDeadline();

struct StreamOptions {
  // The RPC's deadline; InfiniteDuration: none (ctest's timeout bounds
  // the test).
  absl::Duration deadline = DefaultTestDeadline();
  // Cancel the RPC (TryCancel) once this many tokens arrived; -1: never.
  int cancel_after_tokens = -1;
  // Called with the stream so far after each message (on the caller's
  // thread); null: not called.
  std::function<void(const StreamResult&)> on_message;
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
// `took`, if not null: the wall time of the engine's run, which sizes the
// client deadlines of a cluster doing the same work on this host.
std::vector<Expected> InProcessReference(
    const std::vector<v1::GenerateRequest>& requests,
    absl::Duration* took = nullptr);

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_CLUSTER_TEST_UTIL_H_
