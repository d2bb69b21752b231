#include "worker/transport/nccl_kv_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);
static_assert(kKvFrameHeaderBytes + 2 * kKvMaxIdBytes + kKvMaxMessageBytes <=
              kNcclControlBytes);

// --- Control messages over a pair
// ---------------------------------------------

absl::Status SendControl(NcclPairComm& comm, const NcclControl& control,
                         absl::Time deadline, absl::string_view what) {
  EncodeNcclControl(control, std::span<uint8_t, kNcclControlBytes>(
                                 comm.host_send_control(), kNcclControlBytes));
  BATON_RETURN_IF_ERROR(comm.CopyAsync(
      comm.device_send_control(), comm.host_send_control(), kNcclControlBytes));
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kSend,
                          comm.device_send_control(), kNcclControlBytes};
  BATON_RETURN_IF_ERROR(comm.P2pGroup({&op, 1}));
  return comm.Wait(deadline, what);
}

absl::StatusOr<NcclControl> RecvControl(
    NcclPairComm& comm, absl::Time deadline, absl::string_view what,
    const std::function<bool()>& stop = nullptr) {
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kRecv,
                          comm.device_recv_control(), kNcclControlBytes};
  BATON_RETURN_IF_ERROR(comm.P2pGroup({&op, 1}));
  BATON_RETURN_IF_ERROR(comm.CopyAsync(
      comm.host_recv_control(), comm.device_recv_control(), kNcclControlBytes));
  BATON_RETURN_IF_ERROR(comm.Wait(deadline, what, stop));
  return DecodeNcclControl(std::span<const uint8_t, kNcclControlBytes>(
      comm.host_recv_control(), kNcclControlBytes));
}

NcclControl StatusControl(KvFrameKind kind, uint64_t transfer_id,
                          const absl::Status& status) {
  NcclControl c;
  c.frame.kind = kind;
  c.frame.header.transfer_id = transfer_id;
  c.frame.status_code = static_cast<uint32_t>(status.code());
  c.message = std::string(status.message());
  return c;
}

absl::Status StatusOf(const NcclControl& c) {
  if (c.frame.status_code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(c.frame.status_code),
                      c.message);
}

}  // namespace

void EncodeNcclControl(const NcclControl& control,
                       std::span<uint8_t, kNcclControlBytes> out) {
  std::fill(out.begin(), out.end(), 0);
  KvFrame frame = control.frame;
  const bool has_message =
      frame.kind == KvFrameKind::kStatus || frame.kind == KvFrameKind::kAbort;
  const size_t message_bytes =
      has_message ? std::min(control.message.size(), kKvMaxMessageBytes) : 0;
  if (has_message) frame.header.payload_bytes = message_bytes;
  const KvFrameBytes head = EncodeKvFrame(frame);
  uint8_t* p = std::copy(head.begin(), head.end(), out.data());
  if (frame.kind == KvFrameKind::kLayer) {
    p = std::copy(frame.header.request_id.begin(),
                  frame.header.request_id.end(), p);
    std::copy(frame.header.model_id.begin(), frame.header.model_id.end(), p);
  } else if (has_message) {
    std::copy_n(control.message.begin(), message_bytes, p);
  }
}

absl::StatusOr<NcclControl> DecodeNcclControl(
    std::span<const uint8_t, kNcclControlBytes> in) {
  NcclControl c;
  BATON_ASSIGN_OR_RETURN(c.frame,
                         DecodeKvFrame(in.first<kKvFrameHeaderBytes>()));
  const char* p =
      reinterpret_cast<const char*>(in.data()) + kKvFrameHeaderBytes;
  if (c.frame.kind == KvFrameKind::kLayer) {
    c.frame.header.request_id.assign(p, c.frame.request_id_bytes);
    c.frame.header.model_id.assign(p + c.frame.request_id_bytes,
                                   c.frame.model_id_bytes);
  } else if (c.frame.kind == KvFrameKind::kStatus ||
             c.frame.kind == KvFrameKind::kAbort) {
    c.message.assign(p, c.frame.header.payload_bytes);
  }
  return c;
}

// --- NcclKvSender
// -------------------------------------------------------------

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

absl::Status NcclKvSender::SendLayerFromPool(
    const KvTransferHeader& header, const KvDeviceLayerSource& source) {
  if (!error_.ok()) return error_;
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  const uint64_t chunk = header.layout.chunk_bytes();
  const int64_t blocks = (header.num_tokens + header.layout.block_size - 1) /
                         header.layout.block_size;
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
                                        std::span<const NcclApi::P2pOp> ops) {
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
  if (verdict->frame.kind != KvFrameKind::kStatus ||
      verdict->frame.header.transfer_id != transfer_id_) {
    const absl::Status s = absl::InternalError(absl::StrCat(
        what, ": receiver answered out of protocol; communicator aborted"));
    comm_->Abort(s);
    return Fail(s);
  }
  if (absl::Status s = StatusOf(*verdict); !s.ok()) {
    return Fail(PrefixStatus("KV receiver rejected the transfer: ", s));
  }
  if (!ops.empty()) {
    if (absl::Status s = comm_->P2pGroup(ops); !s.ok()) return Fail(s);
    if (absl::Status s =
            comm_->Wait(deadline(), absl::StrCat(what, " payload"));
        !s.ok()) {
      return Fail(s);
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
  if (verdict->frame.kind != KvFrameKind::kStatus ||
      verdict->frame.header.transfer_id != transfer_id_) {
    const absl::Status s = absl::InternalError(absl::StrCat(
        what, ": receiver answered out of protocol; communicator aborted"));
    comm_->Abort(s);
    return Fail(s);
  }
  if (absl::Status s = StatusOf(*verdict); !s.ok()) {
    return Fail(PrefixStatus("KV receiver failed the transfer: ", s));
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

// --- NcclKvReceiver
// -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<NcclKvReceiver>> NcclKvReceiver::Create(
    NcclCommPool* pool, const NcclKvReceiverOptions& options,
    NcclKvReceiverCallbacks callbacks) {
  if (pool == nullptr || !callbacks.lookup || !callbacks.on_done) {
    return absl::InvalidArgumentError(
        "NcclKvReceiver needs a pool and the lookup and on_done callbacks");
  }
  return std::unique_ptr<NcclKvReceiver>(
      new NcclKvReceiver(pool, options, std::move(callbacks)));
}

NcclKvReceiver::~NcclKvReceiver() {
  std::vector<Pair*> pairs;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [key, pair] : pairs_) pairs.push_back(pair.get());
  }
  for (Pair* pair : pairs) pair->thread.join();
}

absl::Status NcclKvReceiver::Expect(const NcclPairHandshake& handshake,
                                    uint64_t transfer_id) {
  BATON_RETURN_IF_ERROR(ValidateNcclHandshake(handshake));
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Pair>& pair = pairs_[handshake.comm_key];
  const bool start = pair == nullptr;
  if (start) {
    pair = std::make_unique<Pair>();
    pair->handshake = handshake;
  }
  if (pair->awaiting.contains(transfer_id)) {
    return absl::InvalidArgumentError(absl::StrCat("KV transfer ", transfer_id,
                                                   " is already expected on '",
                                                   handshake.comm_key, "'"));
  }
  if (handshake.generation > pair->handshake.generation) {
    pair->handshake = handshake;
  }
  pair->awaiting[transfer_id] = {handshake.generation,
                                 absl::Now() + options_.first_frame_timeout};
  if (start) {
    Pair* p = pair.get();
    pair->thread = std::thread([this, p] { ServePair(p); });
  }
  return absl::OkStatus();
}

void NcclKvReceiver::EndTransfer(Pair* pair, uint64_t transfer_id,
                                 absl::Status status) {
  pair->active.erase(transfer_id);
  {
    absl::MutexLock lock(&mu_);
    pair->awaiting.erase(transfer_id);
  }
  pair->ended.insert(transfer_id);
  pair->ended_order.push_back(transfer_id);
  if (static_cast<int>(pair->ended_order.size()) >
      options_.max_ended_remembered) {
    pair->ended.erase(pair->ended_order.front());
    pair->ended_order.erase(pair->ended_order.begin());
  }
  callbacks_.on_done(transfer_id, std::move(status));
}

void NcclKvReceiver::FailPair(Pair* pair, const absl::Status& status,
                              uint64_t generation) {
  std::vector<uint64_t> ids;
  for (const auto& [id, transfer] : pair->active) ids.push_back(id);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, expected] : pair->awaiting) {
      if (expected.first <= generation) ids.push_back(id);
    }
  }
  for (uint64_t id : ids) EndTransfer(pair, id, status);
}

void NcclKvReceiver::ServePair(Pair* pair) {
  std::shared_ptr<NcclPairComm> comm;
  while (true) {
    NcclPairHandshake handshake;
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [&] {
        return stopping_.load() || !pair->awaiting.empty() ||
               !pair->active.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) break;
      handshake = pair->handshake;
      deadline = pair->active.empty()
                     ? absl::InfiniteFuture()
                     : pair->last_progress + options_.stall_timeout;
      for (const auto& [id, expected] : pair->awaiting) {
        deadline = std::min(deadline, expected.second);
      }
    }
    if (comm == nullptr || comm->generation() < handshake.generation) {
      absl::StatusOr<std::shared_ptr<NcclPairComm>> joined =
          pool_->GetOrCreate(handshake, NcclPairRole::kReceiver);
      if (!joined.ok()) {
        FailPair(pair, joined.status(), handshake.generation);
        comm = nullptr;
        continue;
      }
      comm = *std::move(joined);
      pair->last_progress = absl::Now();
    }
    if (absl::Status s = ServeFrame(pair, *comm, deadline); !s.ok()) {
      comm->Abort(s);
      FailPair(pair, comm->health(), comm->generation());
      comm = nullptr;
    }
  }
  FailPair(pair, absl::CancelledError("KV receiver shut down"), ~uint64_t{0});
}

absl::Status NcclKvReceiver::ServeFrame(Pair* pair, NcclPairComm& comm,
                                        absl::Time deadline) {
  absl::MutexLock lock(&comm.exchange_mutex());
  BATON_ASSIGN_OR_RETURN(NcclControl c,
                         RecvControl(comm, deadline, "waiting for a KV frame",
                                     [this] { return stopping_.load(); }));
  pair->last_progress = absl::Now();
  const uint64_t id = c.frame.header.transfer_id;
  const absl::Time reply_deadline = absl::Now() + options_.stall_timeout;
  switch (c.frame.kind) {
    case KvFrameKind::kLayer:
      return ServeLayer(pair, comm, c.frame);
    case KvFrameKind::kFinish: {
      absl::Status status;
      if (Transfer* t = StartOrFind(pair, id, &status); t != nullptr) {
        auto missing = std::find(t->landed.begin(), t->landed.end(), false);
        if (missing != t->landed.end()) {
          status = absl::FailedPreconditionError(absl::StrCat(
              "KV transfer ", id, ": finished without layer ",
              missing - t->landed.begin(), " of ", t->landed.size()));
        }
        EndTransfer(pair, id, status);
      }
      return SendControl(comm, StatusControl(KvFrameKind::kStatus, id, status),
                         reply_deadline, "KV finish verdict");
    }
    case KvFrameKind::kAbort: {
      absl::Status status;
      absl::Status reason = StatusOf(c);
      if (reason.ok()) reason = absl::CancelledError("aborted");
      if (StartOrFind(pair, id, &status) != nullptr) {
        EndTransfer(pair, id, PrefixStatus("KV sender aborted: ", reason));
      }
      return absl::OkStatus();
    }
    case KvFrameKind::kStatus:
      break;
  }
  return absl::InternalError(absl::StrCat("NCCL pair '", comm.comm_key(),
                                          "': sender sent a status frame"));
}

NcclKvReceiver::Transfer* NcclKvReceiver::StartOrFind(Pair* pair,
                                                      uint64_t transfer_id,
                                                      absl::Status* status) {
  if (auto it = pair->active.find(transfer_id); it != pair->active.end()) {
    return &it->second;
  }
  if (pair->ended.contains(transfer_id)) {
    *status = absl::FailedPreconditionError(
        absl::StrCat("KV transfer ", transfer_id, " has already ended"));
    return nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    pair->awaiting.erase(transfer_id);
  }
  absl::StatusOr<NcclKvTarget> target = callbacks_.lookup(transfer_id);
  if (target.ok() &&
      (target->target.cache == nullptr || target->target.table == nullptr ||
       target->device_pool == nullptr)) {
    target = absl::InternalError(
        "lookup returned a target without cache, table or device pool");
  }
  if (!target.ok()) {
    *status = target.status();
    EndTransfer(pair, transfer_id, target.status());
    return nullptr;
  }
  Transfer& t = pair->active[transfer_id];
  t.landed.assign(target->target.expected_layout.num_layers, false);
  t.target = *std::move(target);
  return &t;
}

absl::Status NcclKvReceiver::ServeLayer(Pair* pair, NcclPairComm& comm,
                                        const KvFrame& f) {
  const uint64_t id = f.header.transfer_id;
  const absl::Time reply_deadline = absl::Now() + options_.stall_timeout;
  absl::Status status;
  Transfer* t = StartOrFind(pair, id, &status);
  std::vector<NcclApi::P2pOp> ops;
  if (t != nullptr) {
    const KvTransferTarget& target = t->target.target;
    status = ValidateLayerHeader(f.header, target);
    if (status.ok() && t->landed[f.header.layer]) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "KV transfer ", id, ": layer ", f.header.layer, " sent twice"));
    }
    if (status.ok()) {
      std::optional<absl::ReaderMutexLock> cache_lock;
      if (target.cache_mutex != nullptr) cache_lock.emplace(target.cache_mutex);
      const int64_t blocks = target.cache->BlocksNeeded(f.header.num_tokens);
      if (target.table->num_blocks() < blocks) {
        status = absl::FailedPreconditionError(
            absl::StrCat("KV transfer ", id, ": reserved table holds ",
                         target.table->num_blocks(), " blocks, ", blocks,
                         " needed for ", f.header.num_tokens, " tokens"));
      } else {
        const uint64_t chunk = target.cache->chunk_bytes();
        uint8_t* base = static_cast<uint8_t*>(t->target.device_pool);
        for (int64_t i = 0; i < blocks; ++i) {
          const uint64_t block = target.table->block_ids()[i];
          const uint64_t offset = (static_cast<uint64_t>(f.header.layer) *
                                       target.cache->num_blocks_total() +
                                   block) *
                                  chunk;
          ops.push_back({NcclApi::P2pOp::Kind::kRecv, base + offset, chunk});
        }
      }
    }
    if (!status.ok()) EndTransfer(pair, id, status);
  }
  BATON_RETURN_IF_ERROR(
      SendControl(comm, StatusControl(KvFrameKind::kStatus, id, status),
                  reply_deadline, "KV layer verdict"));
  if (!status.ok()) return absl::OkStatus();
  if (!ops.empty()) {
    BATON_RETURN_IF_ERROR(comm.P2pGroup(ops));
    BATON_RETURN_IF_ERROR(comm.Wait(
        absl::Now() + options_.stall_timeout,
        absl::StrCat("KV transfer ", id, " layer ", f.header.layer, " payload"),
        [this] { return stopping_.load(); }));
  }
  pair->last_progress = absl::Now();
  t->landed[f.header.layer] = true;
  if (callbacks_.on_layer) callbacks_.on_layer(id, f.header.layer);
  return absl::OkStatus();
}

}  // namespace baton
