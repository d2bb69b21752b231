// A split prefill's KV sink: chosen from its target's endpoints, or awaited
// when the target follows the Prefill (SetKvTarget).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/tsan/annotations.h"
#include "worker/service/worker_service.h"
#include "worker/service/worker_service_internal.h"

namespace baton {

absl::Status WorkerService::ChooseKvSink(const v1::PrefillRequest& request,
                                         PrefillOptions* prefill_options,
                                         v1::KvTransport* chosen) {
  const v1::KvTarget& target = request.kv_target();
  // A device-direct endpoint on this worker's own device wins; otherwise
  // HOST_TCP.
  const v1::KvEndpoint* device = nullptr;
  const v1::KvEndpoint* nccl = nullptr;
  const v1::KvEndpoint* tcp = nullptr;
  std::vector<const v1::KvEndpoint*> endpoints = {&target.endpoint()};
  for (const v1::KvEndpoint& e : target.alternatives()) endpoints.push_back(&e);
  for (const v1::KvEndpoint* e : endpoints) {
    if (device == nullptr && options_.make_device_sink &&
        e->transport() == options_.device_kv_transport &&
        !options_.kv_device.empty() && e->device() == options_.kv_device &&
        !e->address().empty()) {
      device = e;
    }
    // NCCL refuses two ranks on one device: only across devices.
    if (nccl == nullptr && options_.make_nccl_sink &&
        e->transport() == v1::KV_TRANSPORT_NCCL &&
        !options_.kv_device.empty() && !e->device().empty() &&
        e->device() != options_.kv_device && !e->address().empty()) {
      nccl = e;
    }
    if (tcp == nullptr && (e->transport() == v1::KV_TRANSPORT_HOST_TCP ||
                           e->transport() == v1::KV_TRANSPORT_UNSPECIFIED)) {
      tcp = e;
    }
  }
  if (device == nullptr && nccl != nullptr) device = nccl;
  if (device == nullptr && tcp == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "kv_target.endpoint.transport: ",
        v1::KvTransport_Name(target.endpoint().transport()),
        " is not supported here (HOST_TCP, or a device-direct endpoint on "
        "this worker's device)"));
  }
  if (device == nullptr && tcp->address().empty()) {
    return absl::InvalidArgumentError("kv_target.endpoint.address: required");
  }
  uint64_t transfer_id = 0;
  if (!absl::SimpleAtoi(target.transfer_id(), &transfer_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_target.transfer_id: '", target.transfer_id(),
                     "' is not a transfer id from ReserveKv"));
  }
  const std::string& id = request.request_id();
  *chosen = device != nullptr ? device->transport() : v1::KV_TRANSPORT_HOST_TCP;
  if (device != nullptr && device->transport() == v1::KV_TRANSPORT_NCCL) {
    v1::PairKvRequest pair;
    pair.set_request_id(id);
    pair.set_transfer_id(target.transfer_id());
    pair.set_transfer_secret(target.transfer_secret());
    {
      absl::MutexLock lock(&mu_);
      *pair.mutable_prefill_worker() = ref_;
    }
    prefill_options->make_sink =
        options_.make_nccl_sink(device->address(), pair, options_.model_id);
    prefill_options->sink_reads_device_pool = true;
  } else if (device != nullptr) {
    prefill_options->make_sink =
        options_.make_device_sink(device->address(), transfer_id,
                                  options_.model_id, target.transfer_secret());
    prefill_options->sink_reads_device_pool = true;
  } else {
    prefill_options->make_sink =
        TcpKvSink(tcp->address(), transfer_id, target.transfer_secret());
  }
  prefill_options->first_block = target.first_block();
  return absl::OkStatus();
}

KvSinkFactory WorkerService::FollowingKvSink(const std::string& id) {
  return [this, id](const KvSinkInfo& info)
             -> absl::StatusOr<std::unique_ptr<KvSink>> {
    // On the handoff's sender thread: the engine goes on meanwhile.
    absl::StatusOr<v1::KvTarget> target =
        following_.Await(id, absl::FromChrono(options_.handoff_timeout));
    if (!target.ok()) return target.status();
    absl::StatusOr<HostTcpTarget> tcp = ParseHostTcpTarget(*target);
    if (!tcp.ok()) return tcp.status();
    const int64_t block_size = info.layout.block_size;
    const int64_t blocks = (info.num_tokens + block_size - 1) / block_size;
    const int64_t first = target->first_block();
    if (first < info.first_block || first >= blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_target.first_block: ", first, " must be in [", info.first_block,
          ", ", blocks, ") for a prompt of ", info.num_tokens, " tokens"));
    }
    KvSinkInfo sent = info;
    sent.first_block = first;
    absl::StatusOr<std::unique_ptr<KvSink>> sink = TcpKvSink(
        tcp->address, tcp->transfer_id, target->transfer_secret())(sent);
    if (!sink.ok()) return sink.status();
    return std::make_unique<HeldLeadingBlocksSink>(std::move(*sink),
                                                   first - info.first_block);
  };
}

grpc::ServerUnaryReactor* WorkerService::SetKvTarget(
    grpc::CallbackServerContext* context, const v1::SetKvTargetRequest* request,
    v1::SetKvTargetResponse* /*response*/) {
  const TsanHandlerScope handler(this);  // see common/tsan/annotations.h
  if (request->request_id().empty()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError("request_id: required"));
  }
  return FinishUnary(
      context, following_.Deliver(request->request_id(), request->kv_target()));
}

}  // namespace baton
