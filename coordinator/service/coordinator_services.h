// The coordinator's two gRPC services over one Cluster:
//   ControlPlaneService  baton.v1.Coordinator (workers register, heartbeat,
//                        deregister);
//   BatonService         baton.v1.Baton, the public API (Generate, Tokenize,
//                        ListModels, GetClusterStatus).
// Both use the callback API; no handler blocks (Generate runs on its own
// thread, see generate_call.h).
#ifndef BATON_COORDINATOR_SERVICE_COORDINATOR_SERVICES_H_
#define BATON_COORDINATOR_SERVICE_COORDINATOR_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include "baton/v1/api.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/auth/api_keys.h"
#include "common/tsan/annotations.h"
#include "coordinator/service/cluster.h"

namespace baton::coordinator {

class ControlPlaneService final : public v1::Coordinator::CallbackService {
 public:
  // `cluster` must outlive the service.
  explicit ControlPlaneService(Cluster* cluster) : cluster_(cluster) {
    BATON_TSAN_RELEASE(this);  // handed to gRPC's threads
  }

  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* context,
      const v1::RegisterWorkerRequest* request,
      v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* DeregisterWorker(
      grpc::CallbackServerContext* context,
      const v1::DeregisterWorkerRequest* request,
      v1::DeregisterWorkerResponse* response) override;

 private:
  // Follows the worker's prefix cache in the cluster's PrefixIndex (at most
  // `kv_blocks_total` blocks of it: a worker reporting more is forgotten,
  // logged).
  void ApplyPrefixCacheEvents(const WorkerRef& ref,
                              const v1::PrefixCacheEvents& events,
                              int64_t kv_blocks_total);
  Cluster* const cluster_;
};

// OK without API keys; otherwise the "authorization" metadata must carry a
// key of `keys` (it is read here and never passed on).
absl::Status Authorize(ApiKeys* keys,
                       const grpc::CallbackServerContext* context);

class BatonService final : public v1::Baton::CallbackService {
 public:
  // `cluster` (and `api_keys` when not null) must outlive the service.
  // With `api_keys`, every call needs "authorization: Bearer KEY" metadata
  // with one of its keys (UNAUTHENTICATED otherwise); the health service
  // and reflection beside it stay open.
  explicit BatonService(Cluster* cluster, ApiKeys* api_keys = nullptr)
      : cluster_(cluster), api_keys_(api_keys) {
    BATON_TSAN_RELEASE(this);  // handed to gRPC's threads
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetClusterStatus(
      grpc::CallbackServerContext* context,
      const v1::GetClusterStatusRequest* request,
      v1::GetClusterStatusResponse* response) override;
  // prefix_cache_admin.cc
  grpc::ServerUnaryReactor* ResetPrefixCache(
      grpc::CallbackServerContext* context,
      const v1::ResetPrefixCacheRequest* request,
      v1::ResetPrefixCacheResponse* response) override;

 private:
  Cluster* const cluster_;
  ApiKeys* const api_keys_;
};

}  // namespace baton::coordinator

#endif  // BATON_COORDINATOR_SERVICE_COORDINATOR_SERVICES_H_
