// A baton.v1.Baton server for tests of baton-bench: it generates no text,
// only streams `max_tokens` token ids, one per message, after known delays,
// and fails requests on demand. Delays are deterministic functions of the
// request id, so a test knows what every request should measure.
#ifndef BATON_BENCH_SERVING_STUB_SERVER_H_
#define BATON_BENCH_SERVING_STUB_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::bench {

struct StubServerOptions {
  // Before the first token, counted from the RPC's arrival.
  double first_token_delay_ms = 50;
  // Between successive tokens.
  double token_delay_ms = 10;
  // Each first-token (token) delay gets an offset in [-jitter, +jitter],
  // uniform over a hash of (request id, token index); less than the delay.
  double first_token_jitter_ms = 0;
  double token_jitter_ms = 0;
  // Non-OK: Generate fails with this status before any message (every
  // request, or every fail_every-th to arrive when fail_every > 0).
  grpc::StatusCode fail_code = grpc::StatusCode::OK;
  int fail_every = 0;
  // With fail_code: fail in-band instead, in the final message after the
  // first token (FINISH_REASON_ERROR, error_code = fail_code).
  bool fail_in_band = false;
  std::string model_id = "stub-model";
  int32_t vocab_size = 49152;
};

class StubServer {
 public:
  // Listens on 127.0.0.1 on a port the kernel picks.
  static absl::StatusOr<std::unique_ptr<StubServer>> Start(
      const StubServerOptions& options);
  // Cancels every stream still running and stops the server.
  ~StubServer();
  StubServer(const StubServer&) = delete;
  StubServer& operator=(const StubServer&) = delete;

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  // Generate RPCs received so far.
  int generate_calls() const;

  // The delay before token k of request `request_id` (k = 0: the first
  // token, counted from the RPC's arrival; k > 0: after token k - 1).
  static double DelayMs(const StubServerOptions& options,
                        absl::string_view request_id, int k);

  class Service;

 private:
  StubServer() = default;

  std::string address_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace baton::bench

#endif  // BATON_BENCH_SERVING_STUB_SERVER_H_
