// Baton.ResetPrefixCache: the reset fans out to every worker that is not
// down, concurrently, each call under the worker RPC deadline; the answer
// counts the workers reached and names the ones that were not.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_status.h"
#include "common/tsan/annotations.h"
#include "coordinator/service/coordinator_services.h"

namespace baton::coordinator {
namespace {

struct ResetFanout {
  struct Call {
    std::string worker;
    std::shared_ptr<v1::Worker::Stub> stub;
    grpc::ClientContext context;
    v1::ResetWorkerPrefixCacheRequest request;
    v1::ResetWorkerPrefixCacheResponse response;
  };
  grpc::ServerUnaryReactor* reactor = nullptr;
  v1::ResetPrefixCacheResponse* response = nullptr;
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  size_t pending ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

grpc::ServerUnaryReactor* BatonService::ResetPrefixCache(
    grpc::CallbackServerContext* context,
    const v1::ResetPrefixCacheRequest* /*request*/,
    v1::ResetPrefixCacheResponse* response) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status auth = Authorize(api_keys_, context); !auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  auto* fanout = new ResetFanout();
  fanout->reactor = reactor;
  fanout->response = response;
  const auto deadline =
      std::chrono::system_clock::now() +
      absl::ToChronoMilliseconds(cluster_->options().worker_rpc_timeout);
  for (const WorkerInfo& w : cluster_->registry().List()) {
    if (w.health == WorkerHealth::kDown) continue;
    auto call = std::make_unique<ResetFanout::Call>();
    call->worker = w.ref.id;
    call->stub = cluster_->WorkerStub(w.registration.address);
    call->context.set_deadline(deadline);
    fanout->calls.push_back(std::move(call));
  }
  if (fanout->calls.empty()) {
    delete fanout;
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  {
    absl::MutexLock lock(&fanout->mu);
    fanout->pending = fanout->calls.size();
  }
  // The last callback deletes the fanout, possibly before this loop ends:
  // iterate over a copy, never over fanout->calls.
  std::vector<ResetFanout::Call*> calls;
  for (const auto& owned : fanout->calls) calls.push_back(owned.get());
  BATON_TSAN_RELEASE(fanout);  // the callbacks run on gRPC threads
  for (ResetFanout::Call* call : calls) {
    call->stub->async()->ResetPrefixCache(
        &call->context, &call->request, &call->response,
        [fanout, call, cluster = cluster_](grpc::Status status) {
          BATON_TSAN_ACQUIRE(fanout);
          // Routing stops counting on what the worker dropped now, not at
          // its next heartbeat (whose eviction events then change nothing).
          if (status.ok()) cluster->prefix_index().Forget(call->worker);
          bool last = false;
          {
            absl::MutexLock lock(&fanout->mu);
            v1::ResetPrefixCacheResponse* out = fanout->response;
            if (status.ok()) {
              out->set_workers_reset(out->workers_reset() + 1);
              out->set_blocks_dropped(out->blocks_dropped() +
                                      call->response.blocks_dropped());
            } else {
              out->add_failed_workers(
                  absl::StrCat(call->worker, ": ", status.error_message()));
            }
            last = --fanout->pending == 0;
          }
          if (!last) return;
          fanout->reactor->Finish(grpc::Status::OK);
          delete fanout;
        });
  }
  return reactor;
}

}  // namespace baton::coordinator
