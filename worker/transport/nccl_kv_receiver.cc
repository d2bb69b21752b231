#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/transport/nccl_kv_internal.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton {

using nccl_kv_internal::RecvControl;
using nccl_kv_internal::SendControl;
using nccl_kv_internal::StatusControl;
using nccl_kv_internal::StatusOf;

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
        status = t->progress.CheckComplete();
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
    case KvFrameKind::kHello:
    case KvFrameKind::kChallenge:
    case KvFrameKind::kProof:
    case KvFrameKind::kSimulatedLayer:
      break;
  }
  return absl::InternalError(absl::StrCat(
      "NCCL pair '", comm.comm_key(), "': sender sent frame kind ",
      static_cast<int>(c.frame.kind), " (status, TCP opening or simulated)"));
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
    // A transfer is bound to the pair that Expect()ed it (PairKv proved the
    // sender holds its secret): frames for any other transfer are refused
    // without a lookup and not reported (it may be another pair's).
    absl::MutexLock lock(&mu_);
    if (pair->awaiting.erase(transfer_id) == 0) {
      *status = absl::FailedPreconditionError(absl::StrCat(
          "KV transfer ", transfer_id, " is not expected on NCCL pair '",
          pair->handshake.comm_key, "'"));
      return nullptr;
    }
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
  t.progress.Start(transfer_id, target->target.expected_layout.num_layers);
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
    status = t->progress.CheckLayer(f.header, target);
    if (status.ok()) {
      std::optional<absl::ReaderMutexLock> cache_lock;
      if (target.cache_mutex != nullptr) cache_lock.emplace(target.cache_mutex);
      absl::StatusOr<std::vector<int32_t>> blocks = KvTargetBlockIds(target);
      if (!blocks.ok()) {
        status = PrefixStatus(absl::StrCat("KV transfer ", id, ": "),
                              blocks.status());
      } else {
        const uint64_t chunk = target.cache->chunk_bytes();
        uint8_t* base = static_cast<uint8_t*>(t->target.device_pool);
        for (const int32_t block : *blocks) {
          const uint64_t offset = (static_cast<uint64_t>(f.header.layer) *
                                       target.cache->num_blocks_total() +
                                   static_cast<uint64_t>(block)) *
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
  t->progress.Landed(f.header.layer);
  if (callbacks_.on_layer) callbacks_.on_layer(id, f.header.layer);
  return absl::OkStatus();
}

}  // namespace baton
