#include "worker/transport/nccl_comm_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton {
namespace {

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

absl::Status ValidateNcclHandshake(const NcclPairHandshake& handshake) {
  if (handshake.comm_key.empty()) {
    return absl::InvalidArgumentError("NcclHandshake.comm_key is empty");
  }
  const std::string where =
      absl::StrCat("NcclHandshake for pair '", handshake.comm_key, "': ");
  if (handshake.nranks != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "nranks must be 2, got ", handshake.nranks));
  }
  const bool ranks_ok =
      (handshake.sender_rank == 0 && handshake.receiver_rank == 1) ||
      (handshake.sender_rank == 1 && handshake.receiver_rank == 0);
  if (!ranks_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "sender_rank and receiver_rank must be {0, 1}, got ",
        handshake.sender_rank, " and ", handshake.receiver_rank));
  }
  if (handshake.sender_device < 0 || handshake.receiver_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "devices must be >= 0, got sender_device ",
                     handshake.sender_device, ", receiver_device ",
                     handshake.receiver_device));
  }
  return absl::OkStatus();
}

absl::StatusOr<NcclUniqueIdBytes> NcclUniqueIdFromBytes(absl::string_view b) {
  if (b.size() != kNcclUniqueIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclHandshake.unique_id must be ", kNcclUniqueIdBytes,
                     " bytes, got ", b.size()));
  }
  NcclUniqueIdBytes id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(b[i]);
  return id;
}

// --- NcclPairComm -----------------------------------------------------------

NcclPairComm::NcclPairComm(NcclApi* api, const NcclCommPoolOptions& options,
                           std::string comm_key, uint64_t generation, int rank,
                           int peer, int device)
    : api_(api),
      options_(options),
      comm_key_(std::move(comm_key)),
      generation_(generation),
      rank_(rank),
      peer_(peer),
      device_(device) {}

NcclPairComm::~NcclPairComm() {
  {
    absl::MutexLock lock(&state_mu_);
    if (comm_ != nullptr) {
      if (aborted_) {
        api_->CommAbort(comm_);
      } else {
        api_->CommDestroy(comm_);
      }
      comm_ = nullptr;
    }
  }
  if (stream_ != nullptr) api_->StreamDestroy(device_, stream_);
  if (device_control_ != nullptr) api_->DeviceFree(device_, device_control_);
  if (host_control_ != nullptr) api_->HostFree(host_control_);
}

absl::Status NcclPairComm::health() const {
  absl::MutexLock lock(&state_mu_);
  return status_;
}

absl::Status NcclPairComm::failure() const {
  absl::MutexLock lock(&state_mu_);
  return aborted_ ? status_ : absl::OkStatus();
}

void NcclPairComm::AbortLocked(absl::Status reason) {
  if (aborted_) return;
  aborted_ = true;
  status_ = std::move(reason);
  if (comm_ != nullptr) {
    api_->CommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclPairComm::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError("aborted");
  absl::MutexLock lock(&state_mu_);
  AbortLocked(std::move(reason));
}

absl::Status NcclPairComm::EnsureInitialized(const NcclUniqueIdBytes& id,
                                             int nranks) {
  absl::MutexLock lock(&init_mu_);
  if (!init_done_) {
    init_done_ = true;
    absl::Status s = Initialize(id, nranks);
    if (!s.ok()) {
      absl::MutexLock state_lock(&state_mu_);
      AbortLocked(s);
    }
  }
  return health();
}

absl::Status NcclPairComm::Initialize(const NcclUniqueIdBytes& id, int nranks) {
  const std::string where =
      absl::StrCat("NCCL pair '", comm_key_, "' generation ", generation_,
                   " (rank ", rank_, ", device ", device_, "): ");
  {
    absl::StatusOr<NcclCommHandle> comm =
        api_->CommInitRankNonBlocking(id, nranks, rank_, device_);
    if (!comm.ok()) return Prefixed(where, comm.status());
    absl::MutexLock lock(&state_mu_);
    if (aborted_) {  // aborted while the init call ran
      api_->CommAbort(*comm);
      return status_;
    }
    comm_ = *comm;
  }
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  while (true) {
    {
      absl::MutexLock lock(&state_mu_);
      if (aborted_) return status_;
      absl::StatusOr<bool> in_progress = api_->CommInProgress(comm_);
      if (!in_progress.ok()) {
        return absl::UnavailableError(
            absl::StrCat(where, "joining the communicator failed: ",
                         in_progress.status().message()));
      }
      if (!*in_progress) break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, "peer did not join the communicator within ",
                       absl::FormatDuration(options_.init_timeout)));
    }
    absl::SleepFor(options_.poll_interval);
  }
  absl::StatusOr<NcclStreamHandle> stream = api_->StreamCreate(device_);
  if (!stream.ok()) return Prefixed(where, stream.status());
  stream_ = *stream;
  absl::StatusOr<void*> device_control =
      api_->DeviceAlloc(device_, 2 * kNcclControlBytes);
  if (!device_control.ok()) return Prefixed(where, device_control.status());
  device_control_ = *device_control;
  absl::StatusOr<void*> host_control = api_->HostAlloc(2 * kNcclControlBytes);
  if (!host_control.ok()) return Prefixed(where, host_control.status());
  host_control_ = static_cast<uint8_t*>(*host_control);
  absl::MutexLock lock(&state_mu_);
  if (aborted_) return status_;
  status_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status NcclPairComm::CopyAsync(void* dst, const void* src,
                                     uint64_t bytes) {
  absl::MutexLock lock(&state_mu_);
  if (aborted_ || !status_.ok()) return status_;
  absl::Status s = api_->CopyAsync(device_, dst, src, bytes, stream_);
  if (!s.ok()) {
    AbortLocked(absl::UnavailableError(
        absl::StrCat("NCCL pair '", comm_key_,
                     "': enqueueing a copy failed: ", s.message())));
    return status_;
  }
  return absl::OkStatus();
}

absl::Status NcclPairComm::P2pGroup(std::span<const NcclApi::P2pOp> ops) {
  absl::MutexLock lock(&state_mu_);
  if (aborted_ || !status_.ok()) return status_;
  absl::Status s = api_->P2pGroup(device_, comm_, peer_, stream_, ops);
  if (!s.ok()) {
    AbortLocked(absl::UnavailableError(
        absl::StrCat("NCCL pair '", comm_key_,
                     "': enqueueing send/recv failed: ", s.message())));
    return status_;
  }
  return absl::OkStatus();
}

absl::Status NcclPairComm::Wait(absl::Time deadline, absl::string_view what,
                                const std::function<bool()>& stop) {
  while (true) {
    {
      absl::MutexLock lock(&state_mu_);
      if (aborted_ || !status_.ok()) return status_;
      absl::StatusOr<bool> in_progress = api_->CommInProgress(comm_);
      absl::StatusOr<bool> done = false;
      if (in_progress.ok() && !*in_progress) done = api_->StreamDone(stream_);
      const absl::Status error =
          !in_progress.ok() ? in_progress.status() : done.status();
      if (!error.ok()) {
        AbortLocked(absl::UnavailableError(
            absl::StrCat("NCCL pair '", comm_key_, "' failed during ", what,
                         ": ", error.message())));
        return status_;
      }
      if (*done) return absl::OkStatus();
    }
    if (stop && stop()) {
      absl::MutexLock lock(&state_mu_);
      AbortLocked(absl::CancelledError(
          absl::StrCat("NCCL pair '", comm_key_, "': stopped during ", what)));
      return status_;
    }
    if (absl::Now() >= deadline) {
      absl::MutexLock lock(&state_mu_);
      AbortLocked(absl::DeadlineExceededError(absl::StrCat(
          "NCCL pair '", comm_key_, "' generation ", generation_, ": ", what,
          " did not complete in time; ", "communicator aborted")));
      return status_;
    }
    absl::SleepFor(options_.poll_interval);
  }
}

// --- NcclCommPool -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<NcclCommPool>> NcclCommPool::Create(
    NcclApi* api, const NcclCommPoolOptions& options) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("NcclCommPool: api is null");
  }
  if (options.max_pairs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommPoolOptions.max_pairs must be >= 1, got ", options.max_pairs));
  }
  if (options.init_timeout <= absl::ZeroDuration() ||
      options.poll_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "NcclCommPoolOptions: init_timeout must be > 0 and poll_interval >= 0");
  }
  return std::unique_ptr<NcclCommPool>(new NcclCommPool(api, options));
}

NcclCommPool::~NcclCommPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, pair] : pairs_) {
    if (pair.use_count() > 1) {
      pair->Abort(absl::CancelledError("NCCL communicator pool shut down"));
    }
  }
  pairs_.clear();
}

absl::StatusOr<NcclUniqueIdBytes> NcclCommPool::NewUniqueId() {
  return api_->GetUniqueId();
}

absl::StatusOr<std::shared_ptr<NcclPairComm>> NcclCommPool::GetOrCreate(
    const NcclPairHandshake& handshake, NcclPairRole role) {
  BATON_RETURN_IF_ERROR(ValidateNcclHandshake(handshake));
  const bool sender = role == NcclPairRole::kSender;
  const int rank = sender ? handshake.sender_rank : handshake.receiver_rank;
  const int peer = sender ? handshake.receiver_rank : handshake.sender_rank;
  const int device =
      sender ? handshake.sender_device : handshake.receiver_device;
  std::shared_ptr<NcclPairComm> pair;
  std::shared_ptr<NcclPairComm> replaced;  // aborted outside mu_
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(handshake.comm_key);
    if (it != pairs_.end()) {
      const uint64_t pooled = it->second->generation();
      if (handshake.generation < pooled) {
        return absl::FailedPreconditionError(
            absl::StrCat("NCCL pair '", handshake.comm_key,
                         "': handshake generation ", handshake.generation,
                         " is older than the pooled generation ", pooled));
      }
      if (handshake.generation == pooled) {
        if (it->second->rank() != rank) {
          return absl::FailedPreconditionError(
              absl::StrCat("NCCL pair '", handshake.comm_key, "' generation ",
                           pooled, " is pooled as rank ", it->second->rank(),
                           ", asked for rank ", rank));
        }
        pair = it->second;
      } else {
        replaced = std::move(it->second);
        pairs_.erase(it);
      }
    }
    if (pair == nullptr) {
      if (static_cast<int>(pairs_.size()) >= options_.max_pairs) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "NCCL communicator pool holds max_pairs=", options_.max_pairs,
            " pairs; cannot add '", handshake.comm_key, "'"));
      }
      pair = std::shared_ptr<NcclPairComm>(
          new NcclPairComm(api_, options_, handshake.comm_key,
                           handshake.generation, rank, peer, device));
      pairs_.emplace(handshake.comm_key, pair);
    }
  }
  if (replaced != nullptr) {
    replaced->Abort(absl::UnavailableError(
        absl::StrCat("NCCL pair '", handshake.comm_key, "' generation ",
                     replaced->generation(), " replaced by generation ",
                     handshake.generation)));
  }
  BATON_RETURN_IF_ERROR(
      pair->EnsureInitialized(handshake.unique_id, handshake.nranks));
  return pair;
}

void NcclCommPool::Abort(absl::string_view comm_key, absl::Status reason) {
  std::shared_ptr<NcclPairComm> pair;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(comm_key);
    if (it == pairs_.end()) return;
    pair = it->second;
  }
  pair->Abort(std::move(reason));
}

void NcclCommPool::Release(absl::string_view comm_key) {
  std::shared_ptr<NcclPairComm> pair;
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(comm_key);
  if (it == pairs_.end()) return;
  pair = std::move(it->second);
  pairs_.erase(it);
}

int NcclCommPool::num_pairs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pairs_.size());
}

absl::Status NcclCommPool::PairFailure(absl::string_view comm_key) const {
  std::shared_ptr<NcclPairComm> pair;
  {
    absl::MutexLock lock(&mu_);
    auto it = pairs_.find(comm_key);
    if (it == pairs_.end()) return absl::OkStatus();
    pair = it->second;
  }
  return pair->failure();
}

absl::StatusOr<uint64_t> NcclCommPool::generation(
    absl::string_view comm_key) const {
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(comm_key);
  if (it == pairs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no NCCL pair '", comm_key, "' in the pool"));
  }
  return it->second->generation();
}

}  // namespace baton
