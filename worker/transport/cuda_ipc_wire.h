// Control messages of the CUDA IPC KV transport (cuda_ipc_kv_transport.h) on
// its TCP connection. Every message is a kv_wire.h frame header (72 bytes)
// and a body; the payload itself never travels on the socket:
//
//   kind    dir   body                         meaning
//   layer   S->R  request id, model id         "may I write layer L?"
//                                              (payload_bytes = the layer's
//                                              size, copied by CUDA IPC)
//   status  R->S  message, u32 grant length,   verdict: OK to a layer (with a
//                 grant                        grant on the transfer's first
//                                              layer), or the transfer's end
//                                              (OK after finish, or its error)
//   status  S->R  none; code OK, layer L       "layer L landed"
//   finish  S->R  none
//   abort   S->R  message
//
// A grant (little-endian) tells the sender where to write:
//   off size field
//     0    4 magic 0x4750_4B42 ("BKPG" in memory)
//     4    4 n = number of block ids (<= kCudaIpcMaxGrantBlocks)
//     8   64 cudaIpcMemHandle_t of the receiver's device pool allocation
//    72    8 pool offset: device pool - allocation base
//    80    8 pool bytes: layout.num_layers * num_blocks_total * chunk_bytes
//    88    8 num_blocks_total
//    96 4*n  destination block ids, int32, in token order
#ifndef BATON_WORKER_TRANSPORT_CUDA_IPC_WIRE_H_
#define BATON_WORKER_TRANSPORT_CUDA_IPC_WIRE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/transport/cuda_ipc_api.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/socket_io.h"

namespace baton {

inline constexpr uint32_t kCudaIpcGrantMagic = 0x47504B42;
inline constexpr size_t kCudaIpcGrantHeaderBytes = 96;
// 16M tokens at 16 tokens per block.
inline constexpr uint32_t kCudaIpcMaxGrantBlocks = 1u << 20;

struct CudaIpcGrant {
  CudaIpcHandleBytes handle{};
  uint64_t pool_offset = 0;
  uint64_t pool_bytes = 0;
  int64_t num_blocks_total = 0;
  std::vector<int32_t> block_ids;
};

// REQUIRES: block_ids.size() <= kCudaIpcMaxGrantBlocks.
std::vector<uint8_t> EncodeCudaIpcGrant(const CudaIpcGrant& grant);
// InvalidArgument naming the field: bad magic or size, too many ids,
// num_blocks_total <= 0, pool_bytes 0, an id outside [0, num_blocks_total).
absl::StatusOr<CudaIpcGrant> DecodeCudaIpcGrant(std::span<const uint8_t> in);

// The frame and body of a sender-to-receiver message.
absl::Status SendCudaIpcLayer(int fd, const KvTransferHeader& header,
                              const SocketIoOptions& io);
absl::Status SendCudaIpcLanded(int fd, uint64_t transfer_id, int64_t layer,
                               const SocketIoOptions& io);
absl::Status SendCudaIpcFinish(int fd, uint64_t transfer_id,
                               const SocketIoOptions& io);
absl::Status SendCudaIpcAbort(int fd, uint64_t transfer_id,
                              const absl::Status& reason,
                              const SocketIoOptions& io);

// A receiver-to-sender status message (message cut to kKvMaxMessageBytes).
absl::Status SendCudaIpcVerdict(int fd, uint64_t transfer_id,
                                const absl::Status& status,
                                const std::optional<CudaIpcGrant>& grant,
                                const SocketIoOptions& io);

struct CudaIpcVerdict {
  uint64_t transfer_id = 0;
  absl::Status status;                // what the receiver reported
  std::optional<CudaIpcGrant> grant;  // only with an OK status
};
// Reads one verdict. Errors: the I/O error, or InvalidArgument for a frame
// that is not a well-formed status message (kind, grant length, grant).
absl::StatusOr<CudaIpcVerdict> ReadCudaIpcVerdict(int fd,
                                                  const SocketIoOptions& io);

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_CUDA_IPC_WIRE_H_
