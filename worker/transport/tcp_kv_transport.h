// Host KV transport over TCP: one transfer at a time per connection, frames
// as in kv_wire.h; a connection carries transfer after transfer when the
// sender's options name a TcpKvConnectionPool (tcp_kv_connection_pool.h). The
// sender writes header, ids, the caller's payload (one buffer, or the pool
// chunks of a layer) and the checksum trailer with sendmsg and no copy of the
// payload; given header.checksum == 0 it hashes each chunk just before the
// sendmsg that sends it. The receiver validates each layer header before any
// byte of the layer is written, then recvmsg's the payload straight into the
// reserved table's block chunks, hashing each chunk as it lands, and compares
// the trailer; a mismatch fails the transfer (DataLoss) and, as the blocks are
// reserved but never committed before on_done OK, their bytes are never read
// (kv_transport.h).
#ifndef BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_
#define BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/kv_handshake.h"
#include "worker/transport/kv_tls.h"
#include "worker/transport/kv_transport.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"
#include "worker/transport/tcp_kv_connection_pool.h"

namespace baton {

struct TcpKvSenderOptions {
  // Connect, and every later wait (socket writable, receiver's verdict),
  // fails with DeadlineExceeded after this long without progress.
  absl::Duration stall_timeout = absl::Seconds(10);

  // Performance.
  // Each sendmsg offers at most this many bytes (with checksum 0 the chunks
  // of a call are hashed just before it). Fewer, larger calls win: 2 MiB
  // calls moved 768 KiB - 2 MiB layers 10-20% faster than 1 MiB ones and
  // about twice as fast as 256 KiB ones (kv_transfer_bench,
  // docs/performance.md).
  size_t send_call_bytes = size_t{2} << 20;
  // SO_SNDBUF / SO_RCVBUF of the connection; 0 = the kernel's autotuning.
  int socket_buffer_bytes = 0;
  // May be null. Set: Connect takes an idle connection from it (or connects
  // anew) and a transfer that ends with the receiver's OK returns its
  // connection there; otherwise each transfer connects afresh. Shared: a
  // sender keeps the pool alive until it is destroyed.
  std::shared_ptr<TcpKvConnectionPool> pool = nullptr;
  // The transfer's secret from the receiver's reservation (ReserveKv): the
  // sender proves it holds it before the first layer (kv_wire.h).
  std::string transfer_secret = "";
  // Set: the connection is TLS (kv_tls.h), the receiver's certificate
  // checked against the endpoint's host. Must match the receiver's setting.
  std::shared_ptr<KvTls> tls = nullptr;
  // Simulated-engine workers (--simulate_kv_transfers): each layer goes as a
  // simulated layer frame (kv_wire.h), its header and ids without the
  // payload, which is never read. The receiver must accept them
  // (TcpKvReceiverOptions::accept_simulated_layers).
  bool simulated_layers = false;
};

class TcpKvSender : public KvSender {
 public:
  // Connects to `endpoint` ("host:port") for transfer `transfer_id`.
  // InvalidArgument for a malformed endpoint, Unavailable if refused,
  // DeadlineExceeded if the connect stalls.
  static absl::StatusOr<std::unique_ptr<TcpKvSender>> Connect(
      absl::string_view endpoint, uint64_t transfer_id,
      const TcpKvSenderOptions& options = {});

  TcpKvSender(const TcpKvSender&) = delete;
  TcpKvSender& operator=(const TcpKvSender&) = delete;
  // Aborts with Cancelled if neither Finish nor Abort was called.
  ~TcpKvSender() override;

  // header.checksum == 0: the checksum is computed while sending (no pass
  // before the header), over the layout's chunks; otherwise it is sent as
  // given (the receiver fails the transfer with DataLoss if it is wrong).
  absl::Status SendLayer(const KvTransferHeader& header,
                         std::span<const uint8_t> payload) override;
  // Sends the chunks in place: one sendmsg iovec per run of adjacent chunks,
  // each sendmsg under the gate (never a wait for the peer). With
  // header.checksum == 0 each chunk is hashed, under the gate, right before
  // the sendmsg that first offers it, and the trailer carries
  // KvChecksumChunks(chunks).
  absl::Status SendLayerChunks(const KvTransferHeader& header,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate* gate) override;
  absl::Status Finish() override;
  void Abort(absl::Status reason) override;

 private:
  TcpKvSender(KvConnection connection, std::string endpoint,
              uint64_t transfer_id, const TcpKvSenderOptions& options);
  // Reads the receiver's status frame, waiting per io; returns the status it
  // carries (prefixed), or the I/O error.
  absl::Status ReadVerdict(const SocketIoOptions& io);
  // Hello, the receiver's challenge, the proof of the transfer's secret.
  absl::Status ProveInvited();
  // A simulated layer frame for `header` (options_.simulated_layers).
  absl::Status SendSimulatedLayer(const KvTransferHeader& header);
  // Remembers the first error and closes the socket.
  absl::Status Fail(absl::Status status);

  KvConnection conn_;
  std::string endpoint_;
  uint64_t transfer_id_;
  TcpKvSenderOptions options_;
  bool done_ = false;          // Finish or Abort called
  absl::Status error_;         // first error; every later call returns it
  std::vector<iovec> iov_;     // SendLayerChunks' iovecs, kept for reuse
  KvChecksummer checksummer_;  // SendLayerChunks' inline checksum
};

struct TcpKvReceiverOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port; read it back with port()
  // A transfer whose sender makes no progress for this long fails with
  // DeadlineExceeded (reported through on_done and sent to the sender).
  absl::Duration stall_timeout = absl::Seconds(10);
  // Connections served at once. One more closes the oldest connection on
  // which no sender has proved a transfer's secret yet (so peers that only
  // connect cannot hold every slot), or is refused when every connection
  // has.
  int max_connections = 256;
  // A connection on which a transfer was proved is closed after this long
  // without the next transfer's first frame (the sender's pool drops idle
  // connections sooner: TcpKvConnectionPoolOptions::max_idle). A new one
  // gets stall_timeout for its first frame.
  absl::Duration idle_timeout = absl::Seconds(60);

  // Set: every connection is TLS (kv_tls.h) and must present a
  // certificate from its CA; a sender in the clear is refused at the
  // handshake.
  std::shared_ptr<KvTls> tls = nullptr;
  // Simulated-engine workers only (--simulate_kv_transfers): a simulated
  // layer frame (kv_wire.h) counts as that layer landed, with nothing
  // written. Unset, such a frame fails its transfer with InvalidArgument.
  bool accept_simulated_layers = false;

  // Performance.
  // SO_SNDBUF / SO_RCVBUF of accepted connections; 0 = the kernel's
  // autotuning.
  int socket_buffer_bytes = 0;
};

class TcpKvReceiver : public KvReceiver {
 public:
  // InvalidArgument if a required callback is missing or the port is out of
  // range; Unavailable/Internal naming the address if it cannot listen.
  static absl::StatusOr<std::unique_ptr<TcpKvReceiver>> Start(
      const TcpKvReceiverOptions& options, KvReceiverCallbacks callbacks);

  TcpKvReceiver(const TcpKvReceiver&) = delete;
  TcpKvReceiver& operator=(const TcpKvReceiver&) = delete;
  ~TcpKvReceiver() override;

  std::string endpoint() const override;
  int port() const { return port_; }
  // Connections open now (served or idle between transfers); each is closed
  // before it stops counting.
  int num_connections();

 private:
  // One thread: it waits for a connection while it is the listener, then
  // serves the connection it accepted (see AcceptThenServe).
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
    // Guarded by mu_ (the list is): the socket it serves (-1 before accept
    // and once it is being closed), whether a sender proved a transfer's
    // secret on it, and whether a newer connection shut it down for room.
    int fd = -1;
    bool proven = false;
    bool evicted = false;
  };

  TcpKvReceiver(const TcpKvReceiverOptions& options,
                KvReceiverCallbacks callbacks, UniqueFd listen_fd, int port,
                UniqueFd wake_fd);
  // Starts a thread running AcceptThenServe. REQUIRES: !stopping_.
  void SpawnListener() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leader/follower: exactly one thread (the listener) waits for a
  // connection; once it accepted one it hands the listening role to a new
  // thread and serves the connection itself, so a transfer's first frame is
  // read by the thread the connection woke (no hand-off to a second thread
  // on the critical path). Returns at shutdown or when the connection is
  // served.
  void AcceptThenServe(Connection& self);
  // Joins connection threads that have finished.
  void Reap();
  // Shuts down the oldest open connection not proven nor evicted yet;
  // false if there is none.
  bool EvictUnprovenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serves `self`'s socket `fd` (closed by the caller).
  void Serve(Connection& self, int fd);
  // Serves one transfer; returns its final status. *transfer_known is set
  // once a frame carried a transfer id (then a status frame is owed), and
  // *claimed once lookup returned its target (then on_done is owed).
  absl::Status ServeTransfer(Connection& self, KvStream stream,
                             uint64_t* transfer_id, bool* transfer_known,
                             bool* claimed);

  const TcpKvReceiverOptions options_;
  const KvReceiverCallbacks callbacks_;
  UniqueFd listen_fd_;
  const int port_;
  UniqueFd wake_fd_;  // eventfd; readable once shutdown starts

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // no new threads once set
  int num_serving_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
  // Transfers a connection has claimed (proof matched, lookup succeeded)
  // and not ended: another connection quoting one is refused before lookup.
  LiveTransfers live_;
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_
