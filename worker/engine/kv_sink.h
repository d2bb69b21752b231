// Where a prefill engine hands a sequence's KV cache: one layer at a time, in
// layer order, then Finish. KvSink decouples the engine from the transports
// (TCP today, NCCL later) and lets tests capture or break a handoff.
#ifndef BATON_WORKER_ENGINE_KV_SINK_H_
#define BATON_WORKER_ENGINE_KV_SINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/transport/kv_transport.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton {

// What a sink is told when a handoff starts.
struct KvSinkInfo {
  std::string request_id;
  KvLayout layout;         // the sending pool's layout
  int64_t num_tokens = 0;  // tokens every layer covers
  // The destination holds the sequence's blocks before this one (a cached
  // prefix): each layer carries the chunks from here on.
  int64_t first_block = 0;
};

// One handoff. Driven by one thread: SendLayer(0) ... SendLayer(L-1) (each
// layer through SendLayer or SendLayerChunks), Finish(); or Abort(reason) at
// any point. bytes is the layer's chunks of the blocks [first_block,
// BlocksNeeded(num_tokens)), in table order (what KvCache::ExportLayer
// writes, from first_block), and is only valid during the call.
class KvSink {
 public:
  virtual ~KvSink() = default;
  virtual absl::Status SendLayer(int64_t layer,
                                 std::span<const uint8_t> bytes) = 0;
  // The same layer as its chunks in the pool (KvCache::LayerChunks order):
  // host memory, or the device pool's when the handoff was submitted with
  // PrefillOptions::sink_reads_device_pool. Read in place: only between
  // gate.Enter() and gate.Exit(), and never after Enter() returned false (the
  // owner revoked the memory; return Cancelled then). The bytes do not change
  // during the call. The default copies the chunks under the gate and calls
  // SendLayer.
  virtual absl::Status SendLayerChunks(
      int64_t layer, std::span<const std::span<const uint8_t>> chunks,
      KvReadGate& gate);
  // OK once the destination has every layer; otherwise its error.
  virtual absl::Status Finish() = 0;
  // Abandons the handoff; the destination learns `reason`. Best effort.
  virtual void Abort(absl::Status reason) = 0;
  // Blocks at the start of each layer (of those the handoff was opened
  // with, from KvSinkInfo::first_block) that this sink does not take, the
  // destination holding them already: a sink opened before its target said
  // which. The handoff leaves them out of every layer and of its byte
  // count. Read once, after the sink is opened.
  virtual int64_t leading_blocks_held() const { return 0; }
};

// A sink that hands every call to `inner`: the base of a sink that changes
// one of them (pacing its Finish, saying which leading blocks its
// destination holds).
class ForwardingKvSink : public KvSink {
 public:
  explicit ForwardingKvSink(std::unique_ptr<KvSink> inner)
      : inner_(std::move(inner)) {}
  absl::Status SendLayer(int64_t layer,
                         std::span<const uint8_t> bytes) override {
    return inner_->SendLayer(layer, bytes);
  }
  absl::Status SendLayerChunks(int64_t layer,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate& gate) override {
    return inner_->SendLayerChunks(layer, chunks, gate);
  }
  absl::Status Finish() override { return inner_->Finish(); }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }
  int64_t leading_blocks_held() const override {
    return inner_->leading_blocks_held();
  }

 private:
  std::unique_ptr<KvSink> inner_;
};

// Opens the sink of one handoff; called on the handoff's sender thread.
using KvSinkFactory =
    std::function<absl::StatusOr<std::unique_ptr<KvSink>>(const KvSinkInfo&)>;

// Adapts a KvSender: fills KvTransferHeader (ids, layout, tokens, layer,
// payload bytes) for every layer, with checksum 0: the sender computes the
// checksum as it sends (TcpKvSender hashes each chunk just before its
// sendmsg; the NCCL sender carries none). SendLayerChunks hands the chunks
// to KvSender::SendLayerChunks in place (no copy, no separate pass): device
// addresses for a sender that reads device memory (CUDA IPC, NCCL) when the
// prefill was submitted with PrefillOptions::sink_reads_device_pool.
class TransportKvSink : public KvSink {
 public:
  TransportKvSink(std::unique_ptr<KvSender> sender, uint64_t transfer_id,
                  std::string model_id, const KvSinkInfo& info);
  absl::Status SendLayer(int64_t layer,
                         std::span<const uint8_t> bytes) override;
  absl::Status SendLayerChunks(int64_t layer,
                               std::span<const std::span<const uint8_t>> chunks,
                               KvReadGate& gate) override;
  absl::Status Finish() override { return sender_->Finish(); }
  void Abort(absl::Status reason) override {
    sender_->Abort(std::move(reason));
  }

 private:
  std::unique_ptr<KvSender> sender_;
  KvTransferHeader header_;
};

// A factory connecting a TcpKvSender to `endpoint` for `transfer_id` when
// the handoff starts.
KvSinkFactory TcpKvSinkFactory(std::string endpoint, uint64_t transfer_id,
                               std::string model_id = "",
                               TcpKvSenderOptions options = {});

// Keeps every layer in memory (tests). Read the State once the handoff
// has ended (PrefillOutput.done).
class InMemoryKvSink : public KvSink {
 public:
  struct State {
    std::vector<std::vector<uint8_t>> layers;  // in arrival order
    bool finished = false;
    absl::Status aborted;  // OK unless Abort was called
  };
  explicit InMemoryKvSink(std::shared_ptr<State> state)
      : state_(std::move(state)) {}
  absl::Status SendLayer(int64_t layer,
                         std::span<const uint8_t> bytes) override;
  absl::Status Finish() override;
  void Abort(absl::Status reason) override;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace baton

#endif  // BATON_WORKER_ENGINE_KV_SINK_H_
