// One baton.v1.Baton/Generate call made with gRPC's callback client API:
// no thread waits on it. Messages and the final status are delivered to
// callbacks on gRPC's threads.
#ifndef BATON_COORDINATOR_HTTP_GENERATE_STREAM_H_
#define BATON_COORDINATOR_HTTP_GENERATE_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/api.grpc.pb.h"

namespace baton::http {

struct GenerateCallbacks {
  // Each message of the stream, in order; never concurrently.
  std::function<void(v1::GenerateResponse)> on_message;
  // Once, after the last on_message: the RPC's status, and the retry delay
  // a refusal's trailing metadata asked for (RetryAfterFrom).
  std::function<void(const grpc::Status&, std::optional<absl::Duration>)>
      on_done;
};

class GenerateStream : public grpc::ClientReadReactor<v1::GenerateResponse>,
                       public std::enable_shared_from_this<GenerateStream> {
 public:
  // Starts the call; the stream keeps itself alive until on_done returned.
  // `stub` must outlive the call.
  static std::shared_ptr<GenerateStream> Start(v1::Baton::Stub* stub,
                                               v1::GenerateRequest request,
                                               GenerateCallbacks callbacks);
  // Cancels the call (the coordinator then frees its KV blocks); on_done
  // still comes, with CANCELLED unless the call had already ended.
  void Cancel();

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  GenerateStream(v1::GenerateRequest request, GenerateCallbacks callbacks);

 private:
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  GenerateCallbacks callbacks_;
  std::shared_ptr<GenerateStream> self_;  // until OnDone
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::http

#endif  // BATON_COORDINATOR_HTTP_GENERATE_STREAM_H_
