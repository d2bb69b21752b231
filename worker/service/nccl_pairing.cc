#include "worker/service/nccl_pairing.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/status_macros.h"

namespace baton {

v1::NcclHandshake ToProto(const NcclPairHandshake& h) {
  v1::NcclHandshake proto;
  proto.set_unique_id(std::string(
      reinterpret_cast<const char*>(h.unique_id.data()), h.unique_id.size()));
  proto.set_nranks(h.nranks);
  proto.set_sender_rank(h.sender_rank);
  proto.set_receiver_rank(h.receiver_rank);
  proto.set_comm_key(h.comm_key);
  proto.set_generation(h.generation);
  proto.set_sender_device(h.sender_device);
  proto.set_receiver_device(h.receiver_device);
  return proto;
}

absl::StatusOr<NcclPairHandshake> FromProto(const v1::NcclHandshake& proto) {
  NcclPairHandshake h;
  BATON_ASSIGN_OR_RETURN(h.unique_id, NcclUniqueIdFromBytes(proto.unique_id()));
  h.nranks = proto.nranks();
  h.sender_rank = proto.sender_rank();
  h.receiver_rank = proto.receiver_rank();
  h.comm_key = proto.comm_key();
  h.generation = proto.generation();
  h.sender_device = proto.sender_device();
  h.receiver_device = proto.receiver_device();
  BATON_RETURN_IF_ERROR(ValidateNcclHandshake(h));
  return h;
}

absl::StatusOr<v1::NcclHandshake> NcclPairing::Expect(
    const v1::PairKvRequest& request, uint64_t transfer_id,
    const std::string& decode_worker_id) {
  const v1::WorkerRef& prefill = request.prefill_worker();
  const std::string key = absl::StrCat(
      !prefill.worker_id().empty() ? prefill.worker_id() : prefill.address(),
      "/", decode_worker_id);
  NcclPairHandshake handshake;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(key);
    const bool reuse = it != pairs_.end() && pool_->PairFailure(key).ok() &&
                       it->second.sender_device == request.sender_device();
    if (!reuse) {
      NcclPairHandshake fresh;
      BATON_ASSIGN_OR_RETURN(fresh.unique_id, pool_->NewUniqueId());
      fresh.comm_key = key;
      fresh.generation = it == pairs_.end() ? 1 : it->second.generation + 1;
      fresh.sender_device = request.sender_device();
      fresh.receiver_device = device_;
      BATON_RETURN_IF_ERROR(ValidateNcclHandshake(fresh));
      pairs_[key] = fresh;
    }
    handshake = pairs_[key];
  }
  BATON_RETURN_IF_ERROR(receiver_->Expect(handshake, transfer_id));
  return ToProto(handshake);
}

NcclKvReceiverCallbacks NcclImportCallbacks(Engine* engine) {
  NcclKvReceiverCallbacks callbacks;
  callbacks.lookup =
      [engine](uint64_t transfer_id) -> absl::StatusOr<NcclKvTarget> {
    BATON_ASSIGN_OR_RETURN(KvTransferTarget target,
                           engine->DeviceImportTarget(transfer_id));
    return NcclKvTarget{std::move(target), engine->device_kv_pool()};
  };
  callbacks.on_done = [engine](uint64_t transfer_id, absl::Status status) {
    engine->ImportDone(transfer_id, std::move(status));
  };
  return callbacks;
}

namespace {

absl::StatusOr<NcclPairHandshake> CallPairKv(
    const std::string& address, const v1::PairKvRequest& request,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration timeout) {
  auto stub = v1::Worker::NewStub(grpc::CreateChannel(
      address, credentials != nullptr ? credentials
                                      : grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::PairKvResponse response;
  const grpc::Status status = stub->PairKv(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("PairKv on ", address, ": ", status.error_message()));
  }
  return FromProto(response.nccl());
}

}  // namespace

KvSinkFactory NcclKvSinkFactory(
    NcclCommPool* pool, int sender_device, std::string decode_address,
    v1::PairKvRequest pair, std::string model_id,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    absl::Duration rpc_timeout) {
  pair.set_sender_device(sender_device);
  return [pool, address = std::move(decode_address), pair = std::move(pair),
          model_id = std::move(model_id), credentials = std::move(credentials),
          rpc_timeout](const KvSinkInfo& info)
             -> absl::StatusOr<std::unique_ptr<KvSink>> {
    BATON_ASSIGN_OR_RETURN(NcclPairHandshake handshake,
                           CallPairKv(address, pair, credentials, rpc_timeout));
    uint64_t transfer_id = 0;
    if (!absl::SimpleAtoi(pair.transfer_id(), &transfer_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer_id '", pair.transfer_id(), "'"));
    }
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<NcclKvSender> sender,
                           NcclKvSender::Create(pool, handshake, transfer_id));
    return std::unique_ptr<KvSink>(std::make_unique<TransportKvSink>(
        std::move(sender), transfer_id, model_id, info));
  };
}

}  // namespace baton
