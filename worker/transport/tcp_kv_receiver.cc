#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "worker/transport/tcp_kv_internal.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton {

using tcp_kv_internal::AppendIov;
using tcp_kv_internal::kMaxLinger;
using tcp_kv_internal::SendStatusFrame;

// --------------------------------------------------------------- receiver

absl::StatusOr<std::unique_ptr<TcpKvReceiver>> TcpKvReceiver::Start(
    const TcpKvReceiverOptions& options, KvReceiverCallbacks callbacks) {
  if (!callbacks.lookup || !callbacks.on_done) {
    return absl::InvalidArgumentError(
        "KvReceiverCallbacks: lookup and on_done are required");
  }
  if (options.stall_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "TcpKvReceiverOptions.stall_timeout must be > 0");
  }
  int port = 0;
  BATON_ASSIGN_OR_RETURN(UniqueFd listen_fd,
                         TcpListen(options.host, options.port, &port,
                                   options.socket_buffer_bytes));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) return absl::InternalError("eventfd failed");
  return std::unique_ptr<TcpKvReceiver>(
      new TcpKvReceiver(options, std::move(callbacks), std::move(listen_fd),
                        port, std::move(wake)));
}

TcpKvReceiver::TcpKvReceiver(const TcpKvReceiverOptions& options,
                             KvReceiverCallbacks callbacks, UniqueFd listen_fd,
                             int port, UniqueFd wake_fd)
    : options_(options),
      callbacks_(std::move(callbacks)),
      listen_fd_(std::move(listen_fd)),
      port_(port),
      wake_fd_(std::move(wake_fd)) {
  absl::MutexLock lock(&mu_);
  SpawnListener();
}

TcpKvReceiver::~TcpKvReceiver() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  std::list<Connection> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(connections_);
  }
  // Joined without mu_: a thread may still take it once (to see stopping_).
  for (Connection& c : threads) c.thread.join();
}

std::string TcpKvReceiver::endpoint() const {
  return absl::StrCat(options_.host, ":", port_);
}

void TcpKvReceiver::SpawnListener() {
  Connection& c = connections_.emplace_back();
  c.thread = std::thread([this, &c] {
    AcceptThenServe(c);
    c.done.store(true, std::memory_order_release);
  });
}

void TcpKvReceiver::Reap() {
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

bool TcpKvReceiver::EvictUnprovenLocked() {
  // The list is in accept order: the first match waited longest.
  for (Connection& c : connections_) {
    if (c.fd >= 0 && !c.proven && !c.evicted) {
      c.evicted = true;
      // Its thread sees end of stream (or a failed handshake) and closes
      // it; the fd stays open until that thread clears c.fd under mu_.
      shutdown(c.fd, SHUT_RDWR);
      return true;
    }
  }
  return false;
}

void TcpKvReceiver::AcceptThenServe(Connection& self) {
  int fd = -1;
  while (fd < 0) {
    Reap();  // threads whose connection ended; never on a transfer's path
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    const int rc = poll(fds, 2, 1000);
    if (fds[1].revents != 0) return;
    if (rc <= 0 || fds[0].revents == 0) continue;
    fd = accept4(listen_fd_.get(), nullptr, nullptr,
                 SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    if (num_serving_ >= options_.max_connections && !EvictUnprovenLocked()) {
      close(fd);
      fd = -1;
      continue;
    }
    ++num_serving_;
    self.fd = fd;
    SpawnListener();  // the next connection's thread; this one serves fd
  }
  Serve(self, fd);
  {
    absl::MutexLock lock(&mu_);
    self.fd = -1;  // no eviction reaches it from here on
  }
  close(fd);
  {
    absl::MutexLock lock(&mu_);
    --num_serving_;
  }
  // This thread is joined by a later listener's Reap or at destruction.
}

int TcpKvReceiver::num_connections() {
  absl::MutexLock lock(&mu_);
  return num_serving_;
}

void TcpKvReceiver::Serve(Connection& self, int fd) {
  SocketIoOptions io;
  UniqueSsl tls;
  if (options_.tls != nullptr) {
    // A sender that does not complete the handshake (in the clear, a
    // certificate from another CA, expired) never reaches the transfer's
    // proof: nothing is claimed or reported, and after the linger below
    // the connection is closed.
    io.stall_timeout = options_.stall_timeout;
    io.cancel_fd = wake_fd_.get();
    absl::StatusOr<UniqueSsl> accepted = options_.tls->Accept(fd, io);
    if (accepted.ok()) tls = std::move(*accepted);
  }
  const KvStream stream(fd, tls.get());
  absl::Status status;
  // Transfers one after another until the sender closes the connection
  // between two of them (or one fails).
  while (options_.tls == nullptr || tls != nullptr) {
    uint64_t transfer_id = 0;
    bool known = false;
    bool claimed = false;
    status = ServeTransfer(self, stream, &transfer_id, &known, &claimed);
    // No frame of a new transfer: the sender closed an idle connection (OK),
    // the connection stayed idle past idle_timeout, or shutdown began.
    if (!known) return;
    // A transfer this connection never claimed (no proof, or lookup
    // refused it) is not reported: it may be another connection's.
    if (claimed) {
      callbacks_.on_done(transfer_id, status);
      live_.Release(transfer_id);
    }
    io.stall_timeout = std::min(options_.stall_timeout, kMaxLinger);
    io.cancel_fd = wake_fd_.get();
    if (!SendStatusFrame(stream, KvFrameKind::kStatus, transfer_id, status, io)
             .ok()) {
      return;
    }
    if (!status.ok()) break;
  }
  // Linger: drain what the sender still writes so it reads the error (or
  // the TLS alert) rather than a connection reset. Nothing drained reaches
  // the pool.
  io.stall_timeout = std::min(options_.stall_timeout, kMaxLinger);
  shutdown(fd, SHUT_WR);
  const absl::Time until = absl::Now() + io.stall_timeout;
  std::vector<uint8_t> sink(1 << 16);
  while (absl::Now() < until) {
    io.stall_timeout = until - absl::Now();
    if (!WaitFd(fd, POLLIN, io, "draining").ok()) return;
    const ssize_t n = recv(fd, sink.data(), sink.size(), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
  }
}

absl::Status TcpKvReceiver::ServeTransfer(Connection& self, KvStream stream,
                                          uint64_t* transfer_id, bool* known,
                                          bool* claimed) {
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  io.cancel_fd = wake_fd_.get();
  KvTransferTarget target;
  KvLayerProgress progress_of;
  std::vector<iovec> iov;
  std::vector<std::span<uint8_t>> chunks;
  // Checksum as the payload lands: a chunk is hashed as soon as its last
  // byte arrived (still in cache).
  KvChecksummer checksummer;
  uint64_t received = 0;
  size_t next_chunk = 0;
  const std::function<void(std::span<const uint8_t>)> on_slice =
      [&](std::span<const uint8_t> slice) {
        received += slice.size();
        while (next_chunk < chunks.size() &&
               received >= (next_chunk + 1) * target.cache->chunk_bytes()) {
          checksummer.AddChunk(chunks[next_chunk++]);
        }
      };
  while (true) {
    KvFrameBytes bytes;
    bool eof = false;
    const std::string progress =
        *known ? progress_of.Describe() : std::string("a new KV transfer");
    // Before a transfer's first frame the connection is idle: once a
    // transfer was proved on it, it may wait for the next one up to
    // idle_timeout (a sender's pooled connection), and may end there; a
    // new connection sends its first frame within stall_timeout.
    SocketIoOptions frame_io = io;
    if (!*known) {
      bool proven = false;
      {
        absl::MutexLock lock(&mu_);
        proven = self.proven;
      }
      if (proven) {
        frame_io.stall_timeout =
            std::max(options_.stall_timeout, options_.idle_timeout);
      }
    }
    BATON_RETURN_IF_ERROR(
        PrefixStatus(absl::StrCat(progress, ": "),
                     RecvExact(stream, bytes, frame_io,
                               "waiting for the next frame", &eof)));
    if (eof && !*known) return absl::OkStatus();
    if (eof) {
      return absl::UnavailableError(absl::StrCat(
          progress, ": sender closed the connection without Finish"));
    }
    BATON_ASSIGN_OR_RETURN(KvFrame f, DecodeKvFrame(bytes));
    if (!*known) {
      *transfer_id = f.header.transfer_id;
      *known = true;
      if (f.kind != KvFrameKind::kHello) {
        return absl::UnauthenticatedError(absl::StrCat(
            "KV transfer ", *transfer_id, ": the first frame is kind ",
            static_cast<int>(f.kind), ", not a hello (KV wire version ",
            kKvWireVersion, ")"));
      }
      // Nothing is claimed or written before the sender proved the
      // transfer's secret; a transfer another connection holds is refused
      // without touching it.
      BATON_RETURN_IF_ERROR(
          ChallengeSender(stream, *transfer_id, callbacks_.secret, io));
      {
        // A sender that knows a transfer's secret: no newer connection
        // takes its place.
        absl::MutexLock lock(&mu_);
        self.proven = true;
      }
      BATON_RETURN_IF_ERROR(live_.Claim(*transfer_id));
      absl::StatusOr<KvTransferTarget> looked_up =
          callbacks_.lookup(*transfer_id);
      if (!looked_up.ok()) {
        live_.Release(*transfer_id);
        return looked_up.status();
      }
      *claimed = true;
      target = std::move(*looked_up);
      if (target.cache == nullptr || target.table == nullptr) {
        return absl::InternalError(absl::StrCat(
            "KV transfer ", *transfer_id, ": lookup returned no cache/table"));
      }
      progress_of.Start(*transfer_id, target.expected_layout.num_layers);
      continue;
    } else if (f.header.transfer_id != *transfer_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV frame transfer_id ", f.header.transfer_id,
                       " on the connection of transfer ", *transfer_id));
    }
    if (f.kind == KvFrameKind::kFinish) return progress_of.CheckComplete();
    if (f.kind == KvFrameKind::kHello || f.kind == KvFrameKind::kChallenge ||
        f.kind == KvFrameKind::kProof) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV transfer ", *transfer_id, ": frame kind ",
                       static_cast<int>(f.kind), " in the middle of it"));
    }
    if (f.kind != KvFrameKind::kLayer &&
        f.kind != KvFrameKind::kSimulatedLayer) {
      std::string msg(f.header.payload_bytes, '\0');
      BATON_RETURN_IF_ERROR(
          RecvExact(stream,
                    std::span<uint8_t>(reinterpret_cast<uint8_t*>(msg.data()),
                                       msg.size()),
                    io, "reading a KV abort message"));
      if (f.kind == KvFrameKind::kStatus) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KV transfer ", *transfer_id, ": unexpected status frame"));
      }
      const auto code = f.status_code == 0
                            ? absl::StatusCode::kCancelled
                            : static_cast<absl::StatusCode>(f.status_code);
      return absl::Status(code, absl::StrCat("KV transfer ", *transfer_id,
                                             " aborted by sender: ", msg));
    }
    // Layer frame: ids, validation, payload and trailer, checksum.
    KvTransferHeader& h = f.header;
    std::string ids(f.request_id_bytes + f.model_id_bytes, '\0');
    BATON_RETURN_IF_ERROR(RecvExact(
        stream,
        std::span<uint8_t>(reinterpret_cast<uint8_t*>(ids.data()), ids.size()),
        io, "reading KV header ids"));
    h.request_id = ids.substr(0, f.request_id_bytes);
    h.model_id = ids.substr(f.request_id_bytes);
    if (f.kind == KvFrameKind::kSimulatedLayer) {
      if (!options_.accept_simulated_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KV transfer ", *transfer_id, " layer ", h.layer,
            ": a simulated layer (no bytes; a worker with "
            "--simulate_kv_transfers), and this receiver takes real KV only"));
      }
      BATON_RETURN_IF_ERROR(progress_of.CheckLayer(h, target));
      progress_of.Landed(h.layer);
      if (callbacks_.on_layer) callbacks_.on_layer(*transfer_id, h.layer);
      continue;
    }
    BATON_RETURN_IF_ERROR(progress_of.CheckLayer(h, target));
    // Validated: the payload goes straight into the layer's chunks of the
    // reserved blocks; each chunk is hashed as soon as it has landed.
    {
      std::optional<absl::ReaderMutexLock> lock;
      if (target.cache_mutex != nullptr) lock.emplace(target.cache_mutex);
      BATON_ASSIGN_OR_RETURN(chunks, KvTargetLayerChunks(target, h.layer));
    }
    iov.clear();
    for (std::span<uint8_t> c : chunks) AppendIov(c.data(), c.size(), &iov);
    KvTrailerBytes trailer{};
    iov.push_back({trailer.data(), trailer.size()});
    const std::string what = absl::StrCat("receiving KV layer ", h.layer,
                                          " of transfer ", *transfer_id);
    checksummer.Reset();
    received = 0;
    next_chunk = 0;
    BATON_RETURN_IF_ERROR(
        PrefixStatus(absl::StrCat(progress, ": "),
                     RecvAllV(stream, iov.data(), static_cast<int>(iov.size()),
                              io, what, on_slice)));
    BATON_CHECK_EQ(next_chunk, chunks.size());
    const uint64_t sum = checksummer.Digest();
    const uint64_t expected = DecodeKvTrailer(trailer);
    if (sum != expected) {
      return absl::DataLossError(
          absl::StrCat("KV transfer ", *transfer_id, " layer ", h.layer,
                       ": checksum mismatch (trailer 0x", absl::Hex(expected),
                       ", payload 0x", absl::Hex(sum), ")"));
    }
    progress_of.Landed(h.layer);
    if (callbacks_.on_layer) callbacks_.on_layer(*transfer_id, h.layer);
  }
}

}  // namespace baton
