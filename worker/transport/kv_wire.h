// The TCP KV transport's frame format. Every frame is a fixed 72-byte
// little-endian header, then `id_bytes` of request id and model id, then
// `payload_bytes` of payload, then, for layer frames only, an 8-byte
// little-endian trailer holding the layer's checksum:
//
//   off size field
//     0    4 magic 0x5456_4B42 ("BKVT" in memory)
//     4    2 version (5; version 4 had no first_block (0 at offset 56);
//             version 3 had no hello / challenge / proof; version 2 carried
//             the checksum at offset 56 of the header and had no trailer;
//             version 1 also defined it as XXH3-64 of the whole payload)
//     6    2 kind: 1 layer, 2 finish, 3 abort, 4 status, 5 hello,
//             6 challenge, 7 proof, 8 simulated layer
//     8    8 transfer_id
//    16    4 layer
//    20    4 layout.num_layers
//    24    4 layout.num_kv_heads
//    28    4 layout.head_dim
//    32    4 layout.block_size
//    36    4 layout.dtype (ggml type id)
//    40    8 num_tokens (two's complement)
//    48    8 payload_bytes
//    56    8 first_block: blocks of the sequence the receiver holds
//             already and the payload leaves out (layer frames; 0 in
//             others)
//    64    2 request_id length  (<= kKvMaxIdBytes)
//    66    2 model_id length    (<= kKvMaxIdBytes)
//    68    4 status code (absl::StatusCode; abort and status frames)
//
// Layer frames carry a layer payload and its trailer: KvChecksum(payload,
// layout.chunk_bytes()), XXH3-64 of the per-chunk XXH3-64 hashes. A trailer
// (not a header field) lets the sender hash each chunk just before it goes
// out, while it is in cache, instead of a whole pass over the layer before
// the header; the receiver still validates the header before any payload
// byte lands, and commits nothing before the trailer matched. Abort and
// status frames carry the status message (<= kKvMaxMessageBytes) as
// payload; finish frames none. A simulated layer frame (simulated-engine
// workers, --simulate_kv_transfers) is a layer frame's header and ids with
// no payload and no trailer: payload_bytes says what the layer would
// carry, and only a receiver that accepts simulated layers takes it (the
// layer counts as landed, nothing is written).
// Every transfer opens with a proof that the sender was invited: the
// sender's hello (transfer_id, no payload), the receiver's challenge (a
// fresh random nonce of kKvNonceBytes as payload), and the sender's proof
// (KvProof: HMAC-SHA256 under the transfer's secret, kKvProofBytes as
// payload). The receiver writes nothing, and claims no reservation, before
// the proof matched.
// Sender to receiver: hello, proof, layer*, then finish or abort. Receiver
// to sender: challenge, then one status frame (OK after finish, or the
// error that ended the transfer, or refused it).
#ifndef BATON_WORKER_TRANSPORT_KV_WIRE_H_
#define BATON_WORKER_TRANSPORT_KV_WIRE_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/transport/kv_transport.h"

namespace baton {

inline constexpr uint32_t kKvWireMagic = 0x54564B42;
inline constexpr uint16_t kKvWireVersion = 5;
inline constexpr size_t kKvFrameHeaderBytes = 72;
inline constexpr size_t kKvTrailerBytes = 8;
inline constexpr size_t kKvMaxMessageBytes = 4096;
inline constexpr size_t kKvNonceBytes = 32;
inline constexpr size_t kKvProofBytes = 32;

enum class KvFrameKind : uint16_t {
  kLayer = 1,
  kFinish = 2,
  kAbort = 3,
  kStatus = 4,
  kHello = 5,
  kChallenge = 6,
  kProof = 7,
  kSimulatedLayer = 8,
};

// A decoded frame header. For layer frames `header` is complete once the
// id strings (header.request_id/model_id) are read after the fixed part;
// header.checksum is not on the header (encode ignores it, decode leaves 0):
// it travels in the trailer.
struct KvFrame {
  KvFrameKind kind = KvFrameKind::kLayer;
  KvTransferHeader header;  // request_id / model_id not filled by decode
  uint16_t request_id_bytes = 0;
  uint16_t model_id_bytes = 0;
  uint32_t status_code = 0;
};

using KvFrameBytes = std::array<uint8_t, kKvFrameHeaderBytes>;

// REQUIRES: request/model ids within kKvMaxIdBytes (string lengths of
// frame.header are written, frame.request_id_bytes etc. are ignored).
KvFrameBytes EncodeKvFrame(const KvFrame& frame);

// InvalidArgument naming the field for a bad magic, version, kind, id
// length, message length, or a layout/num_tokens/first_block out of range
// (a layer frame carries at least one block).
absl::StatusOr<KvFrame> DecodeKvFrame(
    std::span<const uint8_t, kKvFrameHeaderBytes> bytes);

using KvTrailerBytes = std::array<uint8_t, kKvTrailerBytes>;

// The layer trailer: `checksum` as 8 little-endian bytes, and back.
KvTrailerBytes EncodeKvTrailer(uint64_t checksum);
uint64_t DecodeKvTrailer(std::span<const uint8_t, kKvTrailerBytes> bytes);

using KvNonce = std::array<uint8_t, kKvNonceBytes>;
using KvProofBytes = std::array<uint8_t, kKvProofBytes>;

inline constexpr size_t kKvSecretBytes = 32;

// Fresh random values (OpenSSL's RAND_bytes): a challenge's nonce, a
// reservation's transfer id (never 0) and its secret.
KvNonce NewKvNonce();
uint64_t NewKvTransferId();
std::string NewKvSecret();
// HMAC-SHA256 keyed by `secret` over "baton-kv-proof-v1", the nonce and the
// transfer id (8 little-endian bytes).
KvProofBytes KvProof(absl::string_view secret, const KvNonce& nonce,
                     uint64_t transfer_id);
// Whether `proof` is KvProof(secret, nonce, transfer_id), compared in
// constant time.
// Whether two secrets are equal, in time independent of where they differ.
bool KvSecretsMatch(absl::string_view a, absl::string_view b);
bool KvProofMatches(absl::string_view secret, const KvNonce& nonce,
                    uint64_t transfer_id, std::span<const uint8_t> proof);

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_KV_WIRE_H_
