// Control messages of the NCCL KV transport (nccl_kv_transport.h): each is
// exactly kNcclControlBytes, a kv_wire.h frame header, then request id and
// model id (layer frames) or the status message (status and abort frames),
// zero padded. CUDA-free, so that every build (and the fuzz build) reaches
// the codec.
#ifndef BATON_WORKER_TRANSPORT_NCCL_KV_WIRE_H_
#define BATON_WORKER_TRANSPORT_NCCL_KV_WIRE_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/nccl_comm_pool.h"

namespace baton {

struct NcclControl {
  KvFrame frame;        // for layer frames header.request_id/model_id set
  std::string message;  // status and abort frames
};

// REQUIRES: ids within kKvMaxIdBytes; the message is cut to
// kKvMaxMessageBytes. frame.header.payload_bytes of status / abort frames
// is replaced by the message length.
void EncodeNcclControl(const NcclControl& control,
                       std::span<uint8_t, kNcclControlBytes> out);
// InvalidArgument for anything DecodeKvFrame rejects.
absl::StatusOr<NcclControl> DecodeNcclControl(
    std::span<const uint8_t, kNcclControlBytes> in);

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_NCCL_KV_WIRE_H_
