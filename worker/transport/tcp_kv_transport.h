// Host KV transport over TCP: one connection per transfer, frames as in
// kv_wire.h. The sender writes header, ids and the caller's payload (one
// buffer, or the pool chunks of a layer) with sendmsg and no copy of the
// payload. The receiver validates each layer header before any byte of the
// layer is written, then recvmsg's the payload straight into the reserved
// table's block chunks, checksumming each slice as it lands; a mismatch
// fails the transfer (DataLoss) and, as the blocks are reserved but never
// committed before on_done OK, their bytes are never read (kv_transport.h).
#ifndef BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_
#define BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/kv_transport.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"

namespace baton {

struct TcpKvSenderOptions {
  // Connect, and every later wait (socket writable, receiver's verdict),
  // fails with DeadlineExceeded after this long without progress.
  absl::Duration stall_timeout = absl::Seconds(10);
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

  absl::Status SendLayer(const KvTransferHeader& header,
                         std::span<const uint8_t> payload) override;
  // Sends the chunks in place: one sendmsg iovec per run of adjacent chunks,
  // each sendmsg under the gate (never a wait for the peer).
  absl::Status SendLayerChunks(const KvTransferHeader& header,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate* gate) override;
  absl::Status Finish() override;
  void Abort(absl::Status reason) override;

 private:
  TcpKvSender(UniqueFd fd, uint64_t transfer_id,
              const TcpKvSenderOptions& options);
  // Reads the receiver's status frame, waiting per io; returns the status it
  // carries (prefixed), or the I/O error.
  absl::Status ReadVerdict(const SocketIoOptions& io);
  // Remembers the first error and closes the socket.
  absl::Status Fail(absl::Status status);

  UniqueFd fd_;
  uint64_t transfer_id_;
  TcpKvSenderOptions options_;
  bool done_ = false;       // Finish or Abort called
  absl::Status error_;      // first error; every later call returns it
  std::vector<iovec> iov_;  // SendLayerChunks' iovecs, kept for reuse
};

struct TcpKvReceiverOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port; read it back with port()
  // A transfer whose sender makes no progress for this long fails with
  // DeadlineExceeded (reported through on_done and sent to the sender).
  absl::Duration stall_timeout = absl::Seconds(10);
  // Connections served at once; more are refused (closed on accept).
  int max_connections = 256;
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

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  TcpKvReceiver(const TcpKvReceiverOptions& options,
                KvReceiverCallbacks callbacks, UniqueFd listen_fd, int port,
                UniqueFd wake_fd);
  void AcceptLoop();
  // Joins connection threads that have finished (all if `all`).
  void Reap(bool all);
  void Serve(int fd);
  // Serves one transfer; returns its final status. *transfer_known is set
  // once a frame carried a transfer id (then on_done is owed).
  absl::Status ServeTransfer(int fd, uint64_t* transfer_id,
                             bool* transfer_known);

  const TcpKvReceiverOptions options_;
  const KvReceiverCallbacks callbacks_;
  UniqueFd listen_fd_;
  const int port_;
  UniqueFd wake_fd_;  // eventfd; readable once shutdown starts
  std::thread acceptor_;

  absl::Mutex mu_;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_TCP_KV_TRANSPORT_H_
