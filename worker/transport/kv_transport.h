// The KV transport interface: moves one request's KV cache from a prefill
// worker's KvCache into a decode worker's KvCache, layer by layer, as each
// layer finishes. Implementations (host TCP today; NCCL and CUDA IPC later)
// sit behind KvSender / KvReceiver.
//
// One transfer = one sender, identified by a transfer id the coordinator hands
// to both sides. The decode worker reserves the destination blocks BEFORE the
// transfer starts and registers them under the transfer id; the receiver finds
// them through KvReceiverCallbacks::lookup when the first frame arrives.
//
// Sender side, per transfer:
//   SendLayer(header for layer 0, bytes) ... SendLayer(layer L-1) ; Finish()
//   (or Abort(status) at any point). Finish returns once the receiver has
//   imported every layer and reported completion, or with its error.
// Receiver side: every layer header is validated (ValidateLayerHeader below)
// BEFORE any byte of that layer is written into the pool; the payload may
// then land straight in the reserved blocks and its checksum is verified in
// place. No byte is COMMITTED before validation: the blocks are reserved for
// this transfer only and nothing reads them until the decode side calls
// SetNumTokens after on_done reported OK, so a layer that fails its checksum
// (or is cut short) fails the transfer and its bytes are never read; the
// reservation is then freed. After a rejection nothing more of the transfer
// is written.
#ifndef BATON_WORKER_TRANSPORT_KV_TRANSPORT_H_
#define BATON_WORKER_TRANSPORT_KV_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "worker/kv_cache/block_table.h"
#include "worker/kv_cache/kv_cache.h"
#include "worker/kv_cache/kv_layout.h"
#include "worker/transport/socket_io.h"

namespace baton {

// Longest request id / model id a header may carry, in bytes.
inline constexpr size_t kKvMaxIdBytes = 256;

// Describes one layer of one transfer. The payload is the layer's chunks of
// the sequence's blocks [first_block, BlocksNeeded(num_tokens)), each
// layout.chunk_bytes(), in block-table order (KvCache::LayerChunks): the
// receiver holds the blocks before first_block already (a prefix it had
// cached), so they do not travel.
struct KvTransferHeader {
  uint64_t transfer_id = 0;
  std::string request_id;      // at most kKvMaxIdBytes bytes
  std::string model_id;        // at most kKvMaxIdBytes bytes
  KvLayout layout;             // the sender's pool layout
  int64_t num_tokens = 0;      // tokens of the sequence every layer covers
  int64_t first_block = 0;     // blocks of the sequence not carried
  int64_t layer = 0;           // in [0, layout.num_layers)
  uint64_t payload_bytes = 0;  // == payload.size()
  // KvChecksum(payload, layout.chunk_bytes()), or 0: the sender computes it
  // while sending (TcpKvSender, carried in the layer's trailer) or the
  // transport carries none (NCCL).
  uint64_t checksum = 0;
};

// 64-bit checksum of a layer payload (wire version 2): the payload is cut
// into pieces of chunk_bytes (the last one shorter if the size is not a
// multiple), each piece is hashed with XXH3-64 (seed 0, xxHash 0.8), and the
// checksum is XXH3-64 (seed 0) of those hashes, each as 8 little-endian
// bytes, in order. Per-chunk hashing lets both sides checksum a layer in
// place in its pool blocks, one-shot per chunk at memory speed (xxHash
// 0.8.1's streaming API over the same bytes runs at half that speed).
// Layer payloads use chunk_bytes = layout.chunk_bytes().
// REQUIRES: chunk_bytes > 0.
uint64_t KvChecksum(std::span<const uint8_t> payload, uint64_t chunk_bytes);

// KvChecksum(concatenation of chunks, chunks[0].size()), without the copy.
// REQUIRES: every chunk but the last is chunks[0].size() bytes (as
// KvCache::LayerChunks gives them).
uint64_t KvChecksumChunks(std::span<const std::span<const uint8_t>> chunks);

// KvChecksum built chunk by chunk, e.g. as chunks land: after Reset() and
// AddChunk() for the payload's pieces in order, Digest() == KvChecksum(
// payload, chunk_bytes).
class KvChecksummer {
 public:
  void Reset() { hashes_.clear(); }
  void AddChunk(std::span<const uint8_t> chunk);
  uint64_t Digest() const;

 private:
  std::vector<uint8_t> hashes_;  // 8 little-endian bytes per chunk
};

// Gates a sender's reads of memory whose owner may take it back (see
// ReadGate in socket_io.h): KvHandoff revokes it when a handoff times out so
// the prefill's blocks can be freed while the sender is still stuck.
using KvReadGate = ReadGate;

// Sends one transfer. Not thread-safe: one thread drives a sender.
class KvSender {
 public:
  virtual ~KvSender() = default;

  // Ships one layer. header.transfer_id must be this sender's transfer,
  // header.payload_bytes == payload.size() and header.checksum is
  // KvChecksum(payload, header.layout.chunk_bytes()) or 0 (see
  // KvTransferHeader::checksum; the receiver rejects a mismatch with
  // DataLoss).
  // Returns the receiver's error as soon as the receiver has rejected the
  // transfer (its code kept, message prefixed), DeadlineExceeded if the peer
  // makes no progress for the stall timeout, Unavailable if it disconnected.
  // After an error every later call returns the same error.
  virtual absl::Status SendLayer(const KvTransferHeader& header,
                                 std::span<const uint8_t> payload) = 0;

  // SendLayer for a payload that is the concatenation of `chunks` (e.g. the
  // pool chunks of KvCache::LayerChunks), read in place. The chunk memory
  // must not change until the call returns. gate (optional) brackets every
  // read of it; a revoked gate fails the call with Cancelled, and the
  // transfer must then be aborted. header.checksum is KvChecksumChunks(chunks)
  // or 0, as for SendLayer.
  // The default copies the chunks (under the gate) into one buffer and calls
  // SendLayer; TcpKvSender sends them with no copy.
  virtual absl::Status SendLayerChunks(
      const KvTransferHeader& header,
      std::span<const std::span<const uint8_t>> chunks, KvReadGate* gate);

  // Ends the transfer and waits for the receiver's verdict: OK once every
  // layer has been imported and the receiver reported completion; otherwise
  // the receiver's error (e.g. FailedPrecondition naming a missing layer).
  virtual absl::Status Finish() = 0;

  // Abandons the transfer: the receiver reports `reason` (same code, message
  // prefixed) and writes nothing more. Best effort, never blocks longer than
  // the stall timeout. No-op after Finish or a previous Abort.
  virtual void Abort(absl::Status reason) = 0;
};

// Blocks a layer of `header` carries: BlocksNeeded(num_tokens) -
// first_block (0 for a header whose fields are out of range).
int64_t KvHeaderBlocks(const KvTransferHeader& header);
// Payload bytes of one layer of `header`: KvHeaderBlocks * chunk_bytes.
uint64_t KvHeaderPayloadBytes(const KvTransferHeader& header);

// Where the receiver writes one transfer; returned by the lookup callback.
// The pointed-to objects must stay alive, and the table must not be freed or
// resized, until on_done has been called for this transfer id. Until then the
// receiver may write any byte of the table's blocks [first_block,
// BlocksNeeded(num_tokens)) (KvTargetBlockIds), in any layer whose header
// passed ValidateLayerHeader; the blocks before first_block are a cached
// prefix, shared with other sequences, and never written.
struct KvTransferTarget {
  KvCache* cache = nullptr;
  const BlockTable* table = nullptr;  // reserved for >= num_tokens tokens
  KvLayout expected_layout;           // usually cache->layout()
  int64_t num_tokens = 0;             // tokens every layer must cover
  int64_t first_block = 0;            // every header must carry this
  // The table holds only the carried blocks [first_block, BlocksNeeded(
  // num_tokens)), as its blocks 0, 1, ... (a device runner's host staging
  // area, kv_staging.h); otherwise it is the sequence's whole table.
  bool staged = false;
  // If non-empty, headers must carry exactly this model id / request id.
  std::string expected_model_id;
  std::string expected_request_id;
  // Optional: the receiver holds it in shared (reader) mode while it reads
  // the table (the block addresses of a layer), so an owner that takes it
  // exclusively around Reserve / SetNumTokens / Free on the same cache never
  // races the receiver. The payload bytes are then written without it: they
  // belong to the reserved table alone, which nobody else touches until
  // on_done.
  absl::Mutex* cache_mutex = nullptr;
};

// Callbacks run on the receiver's connection threads, possibly concurrently
// for different transfers; they must be thread-safe and must not block long.
struct KvReceiverCallbacks {
  // The transfer's secret (kv_wire.h: the sender proves it holds it before
  // lookup runs), without side effects; NotFound for an unknown transfer.
  // Null: any proof is accepted (tests of the data path alone).
  std::function<absl::StatusOr<std::string>(uint64_t transfer_id)> secret;
  // Required. Claims the transfer for this connection (e.g. marks the
  // reservation as being written). NotFound (or any error) rejects the
  // transfer; the error is sent back to the sender, and on_done is not
  // called: the transfer, if it exists, is not this connection's (a second
  // connection quoting a live transfer never touches it).
  std::function<absl::StatusOr<KvTransferTarget>(uint64_t transfer_id)> lookup;
  // Optional: `layer` of the transfer has been imported.
  std::function<void(uint64_t transfer_id, int64_t layer)> on_layer;
  // Required. Called exactly once for every transfer lookup returned a
  // target for: OK when every layer has landed (the caller may then
  // SetNumTokens(num_tokens)), or the error that ended it. After it returns the
  // receiver no longer touches the target, so the caller may Free the table.
  std::function<void(uint64_t transfer_id, absl::Status status)> on_done;
};

// Accepts transfers on a listening endpoint until destroyed. Destruction
// ends in-flight transfers (on_done gets Cancelled), joins every thread and
// closes every socket before returning.
class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // Address senders connect to, e.g. "127.0.0.1:40123".
  virtual std::string endpoint() const = 0;
};

// Checks a layer header against its target before any byte is written:
// layout (CheckLayoutMatches), model id, layer range, num_tokens,
// first_block and payload_bytes == (BlocksNeeded(num_tokens) - first_block)
// * chunk_bytes. InvalidArgument naming the field, the received and the
// expected value, and the transfer.
absl::Status ValidateLayerHeader(const KvTransferHeader& header,
                                 const KvTransferTarget& target);

// The ids of the blocks a transfer writes: the target table's [first_block,
// BlocksNeeded(num_tokens)) (or its first BlocksNeeded(num_tokens) -
// first_block when target.staged). FailedPrecondition when the table holds
// fewer. Read the table under target.cache_mutex (shared) when one is set.
absl::StatusOr<std::vector<int32_t>> KvTargetBlockIds(
    const KvTransferTarget& target);

// The chunks of `layer` that a transfer writes, in order (its blocks as
// KvTargetBlockIds gives them), for receivers that write host memory.
// REQUIRES: the target's table read under target.cache_mutex (shared) when
// one is set. InvalidArgument as KvCache::MutableLayerChunks.
absl::StatusOr<std::vector<std::span<uint8_t>>> KvTargetLayerChunks(
    const KvTransferTarget& target, int64_t layer);

// `status` with its code kept and `prefix` prepended to its message.
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

// One transfer's receive progress, kept the same way by every receiver
// (TCP, CUDA IPC, NCCL): which layers have landed, the request id its
// layers name, and the checks against them.
class KvLayerProgress {
 public:
  // A transfer of `num_layers` layers, none landed.
  void Start(uint64_t transfer_id, int64_t num_layers);
  // Before any byte of a layer is written: the header against the target
  // (ValidateLayerHeader), its request id the same as the earlier layers',
  // the layer not landed yet. InvalidArgument naming what is wrong.
  absl::Status CheckLayer(const KvTransferHeader& header,
                          const KvTransferTarget& target);
  void Landed(int64_t layer);
  // At the sender's finish: FailedPrecondition naming the first layer
  // missing.
  absl::Status CheckComplete() const;
  // "KV transfer N after K of L layers", for messages.
  std::string Describe() const;

 private:
  uint64_t transfer_id_ = 0;
  std::vector<bool> landed_;
  int64_t num_landed_ = 0;
  bool seen_layer_ = false;
  std::string request_id_;  // of the first layer checked
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_KV_TRANSPORT_H_
