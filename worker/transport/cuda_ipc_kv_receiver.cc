#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/tcp_kv_internal.h"

namespace baton {
namespace {

absl::StatusOr<std::string> ReadMessage(int fd, uint64_t bytes,
                                        const SocketIoOptions& io) {
  std::string msg(bytes, '\0');
  BATON_RETURN_IF_ERROR(RecvExact(
      fd,
      std::span<uint8_t>(reinterpret_cast<uint8_t*>(msg.data()), msg.size()),
      io, "reading a KV message"));
  return msg;
}

// The status an abort frame carries.
absl::Status AbortStatus(int fd, const KvFrame& f, const SocketIoOptions& io) {
  BATON_ASSIGN_OR_RETURN(std::string msg,
                         ReadMessage(fd, f.header.payload_bytes, io));
  const auto code = f.status_code == 0
                        ? absl::StatusCode::kCancelled
                        : static_cast<absl::StatusCode>(f.status_code);
  return absl::Status(code, absl::StrCat("KV transfer ", f.header.transfer_id,
                                         " aborted by sender: ", msg));
}

}  // namespace

struct CudaIpcKvReceiver::Transfer {
  uint64_t id = 0;
  CudaIpcKvTarget target;
  KvLayerProgress progress;
  bool granted = false;  // the grant went out with the first OK
};

absl::StatusOr<std::unique_ptr<CudaIpcKvReceiver>> CudaIpcKvReceiver::Start(
    CudaIpcApi* api, const CudaIpcKvReceiverOptions& options,
    CudaIpcKvReceiverCallbacks callbacks) {
  if (api == nullptr || !callbacks.lookup || !callbacks.on_done) {
    return absl::InvalidArgumentError(
        "CudaIpcKvReceiver needs an api and the lookup and on_done callbacks");
  }
  if (options.stall_timeout <= absl::ZeroDuration() ||
      options.landed_timeout <= absl::ZeroDuration() ||
      options.idle_timeout <= absl::ZeroDuration() ||
      options.outstanding_grant_grace < absl::ZeroDuration() ||
      options.max_connections < 1 || options.device < 0) {
    return absl::InvalidArgumentError(
        "CudaIpcKvReceiverOptions: stall_timeout, landed_timeout and "
        "idle_timeout must be > 0, outstanding_grant_grace >= 0, "
        "max_connections >= 1, device >= 0");
  }
  int port = 0;
  BATON_ASSIGN_OR_RETURN(UniqueFd listen_fd,
                         TcpListen(options.host, options.port, &port));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) return absl::InternalError("eventfd failed");
  return std::unique_ptr<CudaIpcKvReceiver>(
      new CudaIpcKvReceiver(api, options, std::move(callbacks),
                            std::move(listen_fd), port, std::move(wake)));
}

CudaIpcKvReceiver::CudaIpcKvReceiver(CudaIpcApi* api,
                                     const CudaIpcKvReceiverOptions& options,
                                     CudaIpcKvReceiverCallbacks callbacks,
                                     UniqueFd listen_fd, int port,
                                     UniqueFd wake_fd)
    : api_(api),
      options_(options),
      callbacks_(std::move(callbacks)),
      listen_fd_(std::move(listen_fd)),
      port_(port),
      wake_fd_(std::move(wake_fd)) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

CudaIpcKvReceiver::~CudaIpcKvReceiver() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  accept_thread_.join();
  std::list<Connection> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (Connection& c : connections) c.thread.join();
}

std::string CudaIpcKvReceiver::endpoint() const {
  return absl::StrCat(options_.host, ":", port_);
}

int CudaIpcKvReceiver::num_exported_pools() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(exports_.size());
}

void CudaIpcKvReceiver::Reap() {
  absl::MutexLock lock(&mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done.load(std::memory_order_acquire)) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void CudaIpcKvReceiver::AcceptLoop() {
  while (true) {
    Reap();
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    const int rc = poll(fds, 2, 1000);
    if (fds[1].revents != 0) return;
    if (rc <= 0 || fds[0].revents == 0) continue;
    const int fd = accept4(listen_fd_.get(), nullptr, nullptr,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_ ||
        static_cast<int>(connections_.size()) >= options_.max_connections) {
      close(fd);
      if (stopping_) return;
      continue;
    }
    Connection& c = connections_.emplace_back();
    c.thread = std::thread([this, &c, fd] {
      Serve(fd);
      c.done.store(true, std::memory_order_release);
    });
  }
}

void CudaIpcKvReceiver::Serve(int raw_fd) {
  UniqueFd fd(raw_fd);
  // The verdict goes out even during shutdown (no cancel fd), bounded by
  // the linger time.
  SocketIoOptions verdict_io;
  verdict_io.stall_timeout =
      std::min(options_.stall_timeout, tcp_kv_internal::kMaxLinger);
  while (true) {
    uint64_t transfer_id = 0;
    bool known = false;
    bool claimed = false;
    bool outstanding = false;
    const absl::Status status =
        ServeTransfer(fd.get(), &transfer_id, &known, &claimed, &outstanding);
    if (!known) return;  // closed (or idle, or shut down) between transfers
    // A copy the sender enqueued may still be landing: let it drain before
    // the caller may free the blocks.
    if (!status.ok() && outstanding) {
      absl::SleepFor(options_.outstanding_grant_grace);
    }
    // A transfer this connection never claimed is not reported: it may be
    // another connection's.
    if (claimed) {
      callbacks_.on_done(transfer_id, status);
      live_.Release(transfer_id);
    }
    if (!SendCudaIpcVerdict(fd.get(), transfer_id, status, std::nullopt,
                            verdict_io)
             .ok() ||
        !status.ok()) {
      break;
    }
  }
  // Linger: drain what the sender still writes so it reads the verdict
  // rather than a connection reset.
  shutdown(fd.get(), SHUT_WR);
  SocketIoOptions io = verdict_io;
  io.cancel_fd = wake_fd_.get();
  const absl::Time until = absl::Now() + verdict_io.stall_timeout;
  uint8_t sink[4096];
  while (absl::Now() < until) {
    io.stall_timeout = until - absl::Now();
    if (!WaitFd(fd.get(), POLLIN, io, "draining").ok()) return;
    const ssize_t n = recv(fd.get(), sink, sizeof(sink), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
  }
}

absl::Status CudaIpcKvReceiver::ServeTransfer(int fd, uint64_t* transfer_id,
                                              bool* known, bool* claimed,
                                              bool* grant_outstanding) {
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  io.cancel_fd = wake_fd_.get();
  Transfer t;
  while (true) {
    const std::string progress = *known
                                     ? absl::StrCat(t.progress.Describe(), ": ")
                                     : std::string("a new KV transfer: ");
    SocketIoOptions frame_io = io;
    if (!*known) {
      frame_io.stall_timeout =
          std::max(options_.stall_timeout, options_.idle_timeout);
    }
    KvFrameBytes bytes;
    bool eof = false;
    BATON_RETURN_IF_ERROR(PrefixStatus(
        progress,
        RecvExact(fd, bytes, frame_io, "waiting for the next frame", &eof)));
    if (eof && !*known) return absl::OkStatus();
    if (eof) {
      return absl::UnavailableError(absl::StrCat(
          progress, "sender closed the connection without Finish"));
    }
    BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
    if (!*known) {
      *transfer_id = t.id = f.header.transfer_id;
      *known = true;
      if (f.kind != KvFrameKind::kHello) {
        return absl::UnauthenticatedError(absl::StrCat(
            "KV transfer ", t.id, ": the first frame is kind ",
            static_cast<int>(f.kind), ", not a hello (KV wire version ",
            kKvWireVersion, ")"));
      }
      // Nothing is claimed or granted before the sender proved the
      // transfer's secret; a transfer another connection holds is refused
      // without touching it.
      BATON_RETURN_IF_ERROR(ChallengeSender(fd, t.id, callbacks_.secret, io));
      BATON_RETURN_IF_ERROR(live_.Claim(t.id));
      absl::StatusOr<CudaIpcKvTarget> looked_up = callbacks_.lookup(t.id);
      if (!looked_up.ok()) {
        live_.Release(t.id);
        return looked_up.status();
      }
      *claimed = true;
      t.target = *std::move(looked_up);
      if (t.target.target.cache == nullptr ||
          t.target.target.table == nullptr || t.target.device_pool == nullptr) {
        return absl::InternalError(
            absl::StrCat("KV transfer ", t.id,
                         ": lookup returned no cache, table or device pool"));
      }
      t.progress.Start(t.id, t.target.target.expected_layout.num_layers);
      continue;
    } else if (f.header.transfer_id != t.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV frame transfer_id ", f.header.transfer_id,
                       " on the connection of transfer ", t.id));
    }
    switch (f.kind) {
      case KvFrameKind::kFinish: {
        return t.progress.CheckComplete();
      }
      case KvFrameKind::kAbort:
        return AbortStatus(fd, f, io);
      case KvFrameKind::kStatus:
        return absl::InvalidArgumentError(
            absl::StrCat("KV transfer ", t.id, ": layer ", f.header.layer,
                         " reported landed without a grant"));
      case KvFrameKind::kHello:
      case KvFrameKind::kChallenge:
      case KvFrameKind::kProof:
      case KvFrameKind::kSimulatedLayer:
        return absl::InvalidArgumentError(absl::StrCat(
            "KV transfer ", t.id, ": frame kind ", static_cast<int>(f.kind),
            " is not part of the CUDA IPC exchange"));
      case KvFrameKind::kLayer:
        BATON_RETURN_IF_ERROR(ServeLayer(fd, t, f, grant_outstanding));
        break;
    }
  }
}

absl::StatusOr<CudaIpcExport> CudaIpcKvReceiver::ExportPool(
    const CudaIpcKvTarget& target) {
  const KvCache& cache = *target.target.cache;
  const uint64_t pool_bytes = static_cast<uint64_t>(cache.layout().num_layers) *
                              cache.num_blocks_total() * cache.chunk_bytes();
  absl::MutexLock lock(&mu_);
  auto it = exports_.find(target.device_pool);
  if (it == exports_.end()) {
    BATON_ASSIGN_OR_RETURN(
        CudaIpcExport ex,
        api_->ExportMemory(options_.device, target.device_pool));
    it = exports_.emplace(target.device_pool, ex).first;
  }
  const CudaIpcExport& ex = it->second;
  if (ex.offset > ex.allocation_bytes ||
      pool_bytes > ex.allocation_bytes - ex.offset) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV device pool of ", pool_bytes, " bytes at offset ", ex.offset,
        " overruns its allocation of ", ex.allocation_bytes, " bytes"));
  }
  return ex;
}

absl::Status CudaIpcKvReceiver::ServeLayer(int fd, Transfer& t,
                                           const KvFrame& frame,
                                           bool* grant_outstanding) {
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  io.cancel_fd = wake_fd_.get();
  KvTransferHeader h = frame.header;
  BATON_ASSIGN_OR_RETURN(
      std::string ids,
      ReadMessage(fd, uint64_t{frame.request_id_bytes} + frame.model_id_bytes,
                  io));
  h.request_id = ids.substr(0, frame.request_id_bytes);
  h.model_id = ids.substr(frame.request_id_bytes);
  const KvTransferTarget& target = t.target.target;
  BATON_RETURN_IF_ERROR(t.progress.CheckLayer(h, target));
  std::optional<CudaIpcGrant> grant;
  if (!t.granted) {
    const int64_t blocks = KvHeaderBlocks(h);
    if (blocks > kCudaIpcMaxGrantBlocks) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV transfer ", t.id, ": ", blocks, " blocks exceed the ",
          kCudaIpcMaxGrantBlocks, " a CUDA IPC grant can carry"));
    }
    grant.emplace();
    {
      std::optional<absl::ReaderMutexLock> lock;
      if (target.cache_mutex != nullptr) lock.emplace(target.cache_mutex);
      absl::StatusOr<std::vector<int32_t>> ids = KvTargetBlockIds(target);
      if (!ids.ok()) {
        return PrefixStatus(absl::StrCat("KV transfer ", t.id, ": "),
                            ids.status());
      }
      grant->block_ids = *std::move(ids);
    }
    BATON_ASSIGN_OR_RETURN(CudaIpcExport ex, ExportPool(t.target));
    grant->handle = ex.handle;
    grant->pool_offset = ex.offset;
    grant->num_blocks_total = target.cache->num_blocks_total();
    grant->pool_bytes =
        static_cast<uint64_t>(target.cache->layout().num_layers) *
        grant->num_blocks_total * target.cache->chunk_bytes();
  }
  // Validated: from this OK until "landed" the sender writes the layer.
  BATON_RETURN_IF_ERROR(
      SendCudaIpcVerdict(fd, t.id, absl::OkStatus(), grant, io));
  t.granted = true;
  *grant_outstanding = true;
  SocketIoOptions landed_io = io;
  landed_io.stall_timeout = options_.landed_timeout;
  const std::string what =
      absl::StrCat("KV transfer ", t.id, " layer ", h.layer, ": ");
  KvFrameBytes bytes;
  bool eof = false;
  BATON_RETURN_IF_ERROR(PrefixStatus(
      what,
      RecvExact(fd, bytes, landed_io, "waiting for the layer to land", &eof)));
  if (eof) {
    return absl::UnavailableError(absl::StrCat(
        what, "sender closed the connection while writing the layer"));
  }
  BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
  if (f.header.transfer_id != t.id) {
    return absl::InvalidArgumentError(absl::StrCat(what, "frame of transfer ",
                                                   f.header.transfer_id,
                                                   " instead of landed"));
  }
  if (f.kind == KvFrameKind::kAbort) return AbortStatus(fd, f, io);
  if (f.kind != KvFrameKind::kStatus || f.status_code != 0 ||
      f.header.layer != h.layer || f.header.payload_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "expected its landed report, got frame kind ",
                     static_cast<int>(f.kind), " for layer ", f.header.layer));
  }
  *grant_outstanding = false;
  t.progress.Landed(h.layer);
  if (callbacks_.on_layer) callbacks_.on_layer(t.id, h.layer);
  return absl::OkStatus();
}

}  // namespace baton
