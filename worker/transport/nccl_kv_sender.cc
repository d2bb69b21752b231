#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/transport/nccl_kv_internal.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton {
namespace {

using nccl_kv_internal::RecvControl;
using nccl_kv_internal::SendControl;
using nccl_kv_internal::StatusControl;
using nccl_kv_internal::StatusOf;

// The receiver's verdict on `what`, a status frame for transfer_id: OK, its
// error prefixed with `rejected_prefix`, or Internal (the communicator
// aborted) when the receiver answered out of protocol.
absl::Status VerdictStatus(NcclPairComm& comm, uint64_t transfer_id,
                           const NcclControl& verdict, absl::string_view what,
                           absl::string_view rejected_prefix) {
  if (verdict.frame.kind != KvFrameKind::kStatus ||
      verdict.frame.header.transfer_id != transfer_id) {
    const absl::Status s = absl::InternalError(absl::StrCat(
        what, ": receiver answered out of protocol; communicator aborted"));
    comm.Abort(s);
    return s;
  }
  if (absl::Status s = StatusOf(verdict); !s.ok()) {
    return PrefixStatus(rejected_prefix, s);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclKvSender>> NcclKvSender::Create(
    NcclCommPool* pool, const NcclPairHandshake& handshake,
    uint64_t transfer_id, const NcclKvSenderOptions& options) {
  if (pool == nullptr) {
    return absl::InvalidArgumentError("NcclKvSender: pool is null");
  }
  BATON_ASSIGN_OR_RETURN(std::shared_ptr<NcclPairComm> comm,
                         pool->GetOrCreate(handshake, NcclPairRole::kSender));
  return std::unique_ptr<NcclKvSender>(
      new NcclKvSender(std::move(comm), transfer_id, options));
}

NcclKvSender::~NcclKvSender() {
  if (!done_) Abort(absl::CancelledError("KV sender destroyed"));
}

absl::Status NcclKvSender::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
  return error_;
}

absl::Status NcclKvSender::CheckHeader(const KvTransferHeader& header) const {
  if (header.transfer_id != transfer_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header transfer_id ", header.transfer_id,
                     " vs this sender's ", transfer_id_));
  }
  if (header.request_id.size() > kKvMaxIdBytes ||
      header.model_id.size() > kKvMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header request_id/model_id longer than ", kKvMaxIdBytes, " bytes"));
  }
  BATON_RETURN_IF_ERROR(header.layout.Validate());
  if (header.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header num_tokens must be >= 0, got ", header.num_tokens));
  }
  if (header.first_block < 0 ||
      (header.first_block > 0 && KvHeaderBlocks(header) == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header first_block ", header.first_block, " leaves no block of ",
        header.num_tokens, " tokens to send"));
  }
  return absl::OkStatus();
}

absl::Status NcclKvSender::SendLayer(const KvTransferHeader& header,
                                     std::span<const uint8_t> payload) {
  if (!error_.ok()) return error_;
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  const uint64_t chunk = header.layout.chunk_bytes();
  if (payload.size() != header.payload_bytes ||
      header.payload_bytes % chunk != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL KV layer ", header.layer, ": payload of ", payload.size(),
        " bytes, header payload_bytes ", header.payload_bytes,
        "; both must be equal and a multiple of chunk_bytes ", chunk));
  }
  std::vector<NcclApi::P2pOp> ops(header.payload_bytes / chunk);
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i] = {NcclApi::P2pOp::Kind::kSend,
              const_cast<uint8_t*>(payload.data()) + i * chunk, chunk};
  }
  return SendLayerOps(header, ops);
}

absl::Status NcclKvSender::SendLayerChunks(
    const KvTransferHeader& header,
    std::span<const std::span<const uint8_t>> chunks, KvReadGate* gate) {
  if (!error_.ok()) return error_;
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  const uint64_t chunk = header.layout.chunk_bytes();
  std::vector<NcclApi::P2pOp> ops(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].size() != chunk) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL KV layer ", header.layer, ": chunk ", i, " has ",
                       chunks[i].size(), " bytes, not chunk_bytes ", chunk));
    }
    ops[i] = {NcclApi::P2pOp::Kind::kSend,
              const_cast<uint8_t*>(chunks[i].data()), chunk};
  }
  if (header.payload_bytes != chunks.size() * chunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL KV layer ", header.layer, ": ", chunks.size(),
        " chunks but header payload_bytes ", header.payload_bytes));
  }
  return SendLayerOps(header, ops, gate);
}

absl::Status NcclKvSender::SendLayerFromPool(
    const KvTransferHeader& header, const KvDeviceLayerSource& source) {
  if (!error_.ok()) return error_;
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  const uint64_t chunk = header.layout.chunk_bytes();
  const int64_t blocks = KvHeaderBlocks(header);
  if (source.device_pool == nullptr ||
      static_cast<int64_t>(source.block_ids.size()) < blocks ||
      header.payload_bytes != static_cast<uint64_t>(blocks) * chunk ||
      header.layer < 0 || header.layer >= header.layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL KV layer ", header.layer, ": source needs a device pool, ",
        blocks, " block ids (has ", source.block_ids.size(),
        ") and payload_bytes ", blocks * chunk, " (header says ",
        header.payload_bytes, ")"));
  }
  std::vector<NcclApi::P2pOp> ops(blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = source.block_ids[i];
    if (b < 0 || b >= source.num_blocks_total) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL KV source block id ", b, " not in [0, ",
                       source.num_blocks_total, ")"));
    }
    const uint64_t offset =
        (static_cast<uint64_t>(header.layer) * source.num_blocks_total + b) *
        chunk;
    ops[i] = {NcclApi::P2pOp::Kind::kSend,
              const_cast<uint8_t*>(
                  static_cast<const uint8_t*>(source.device_pool) + offset),
              chunk};
  }
  return SendLayerOps(header, ops);
}

absl::Status NcclKvSender::SendLayerOps(const KvTransferHeader& header,
                                        std::span<const NcclApi::P2pOp> ops,
                                        KvReadGate* gate) {
  if (done_) {
    return absl::FailedPreconditionError("NCCL KV sender already finished");
  }
  absl::MutexLock lock(&comm_->exchange_mutex());
  NcclControl c;
  c.frame.kind = KvFrameKind::kLayer;
  c.frame.header = header;
  c.frame.header.checksum = 0;
  const std::string what =
      absl::StrCat("KV transfer ", transfer_id_, " layer ", header.layer);
  auto deadline = [&] { return absl::Now() + options_.stall_timeout; };
  if (absl::Status s = SendControl(*comm_, c, deadline(), what); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<NcclControl> verdict =
      RecvControl(*comm_, deadline(), absl::StrCat(what, " verdict"));
  if (!verdict.ok()) return Fail(verdict.status());
  if (absl::Status s = VerdictStatus(*comm_, transfer_id_, *verdict, what,
                                     "KV receiver rejected the transfer: ");
      !s.ok()) {
    return Fail(s);
  }
  if (!ops.empty()) {
    // The receiver has posted its receives, so the payload goes out either
    // way: the pool stays mapped, and a revoked gate only means its blocks
    // may hold other data now. The transfer is then cancelled without
    // failing the sender, so Abort still tells the receiver, and the pair's
    // communicator survives.
    const bool held = gate == nullptr || gate->Enter();
    absl::Status s = comm_->P2pGroup(ops);
    if (s.ok()) s = comm_->Wait(deadline(), absl::StrCat(what, " payload"));
    if (gate != nullptr && held) gate->Exit();
    if (!s.ok()) return Fail(s);
    if (!held) {
      return absl::CancelledError(
          absl::StrCat(what, ": the pool's blocks were revoked"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclKvSender::Finish() {
  if (!error_.ok()) return error_;
  if (done_) {
    return absl::FailedPreconditionError("NCCL KV sender already finished");
  }
  done_ = true;
  absl::MutexLock lock(&comm_->exchange_mutex());
  NcclControl c;
  c.frame.kind = KvFrameKind::kFinish;
  c.frame.header.transfer_id = transfer_id_;
  const std::string what =
      absl::StrCat("KV transfer ", transfer_id_, " finish");
  const absl::Time deadline = absl::Now() + options_.stall_timeout;
  if (absl::Status s = SendControl(*comm_, c, deadline, what); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<NcclControl> verdict = RecvControl(*comm_, deadline, what);
  if (!verdict.ok()) return Fail(verdict.status());
  if (absl::Status s = VerdictStatus(*comm_, transfer_id_, *verdict, what,
                                     "KV receiver failed the transfer: ");
      !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

void NcclKvSender::Abort(absl::Status reason) {
  if (done_) return;
  done_ = true;
  if (reason.ok()) reason = absl::CancelledError("aborted by sender");
  if (!error_.ok()) return;  // the receiver already ended the transfer
  error_ = reason;
  absl::MutexLock lock(&comm_->exchange_mutex());
  (void)SendControl(*comm_,
                    StatusControl(KvFrameKind::kAbort, transfer_id_, reason),
                    absl::Now() + options_.stall_timeout,
                    absl::StrCat("KV transfer ", transfer_id_, " abort"));
}

}  // namespace baton
