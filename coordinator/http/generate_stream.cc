#include "coordinator/http/generate_stream.h"

#include <utility>

#include "common/grpc/grpc_status.h"
#include "common/tsan/annotations.h"

namespace baton::http {

GenerateStream::GenerateStream(v1::GenerateRequest request,
                               GenerateCallbacks callbacks)
    : request_(std::move(request)), callbacks_(std::move(callbacks)) {}

std::shared_ptr<GenerateStream> GenerateStream::Start(
    v1::Baton::Stub* stub, v1::GenerateRequest request,
    GenerateCallbacks callbacks) {
  auto stream = std::make_shared<GenerateStream>(std::move(request),
                                                 std::move(callbacks));
  stream->self_ = stream;
  // gRPC (not built for TSan) runs the reactions on its threads.
  BATON_TSAN_RELEASE(stream.get());
  stub->async()->Generate(&stream->context_, &stream->request_, stream.get());
  stream->StartRead(&stream->response_);
  stream->StartCall();
  absl::MutexLock lock(&stream->mu_);
  stream->started_ = true;
  if (stream->cancel_) stream->context_.TryCancel();
  return stream;
}

void GenerateStream::Cancel() {
  absl::MutexLock lock(&mu_);
  cancel_ = true;
  if (started_) context_.TryCancel();
}

void GenerateStream::OnReadDone(bool ok) {
  BATON_TSAN_ACQUIRE(this);
  if (!ok) return;  // OnDone follows
  v1::GenerateResponse message = std::move(response_);
  response_.Clear();
  callbacks_.on_message(std::move(message));
  BATON_TSAN_RELEASE(this);  // the next reaction may run on another thread
  StartRead(&response_);
}

void GenerateStream::OnDone(const grpc::Status& status) {
  BATON_TSAN_ACQUIRE(this);
  callbacks_.on_done(status,
                     status.ok() ? std::nullopt : RetryAfterFrom(context_));
  callbacks_ = GenerateCallbacks();
  // Last use of `this`: the stream may be destroyed here.
  std::shared_ptr<GenerateStream> self = std::move(self_);
}

}  // namespace baton::http
