// Pieces the NCCL KV sender and receiver share: one control message
// (kNcclControlBytes, nccl_kv_transport.h's protocol) sent or received over
// a pair, and status <-> status frame conversion.
#ifndef BATON_WORKER_TRANSPORT_NCCL_KV_INTERNAL_H_
#define BATON_WORKER_TRANSPORT_NCCL_KV_INTERNAL_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/transport/kv_wire.h"
#include "worker/transport/nccl_comm_pool.h"
#include "worker/transport/nccl_kv_transport.h"

namespace baton::nccl_kv_internal {

// Encodes `control` into the pair's send staging buffer, sends it and waits
// (NcclPairComm::Wait with `deadline` and `what`). REQUIRES: the caller
// holds comm.exchange_mutex().
absl::Status SendControl(NcclPairComm& comm, const NcclControl& control,
                         absl::Time deadline, absl::string_view what);

// Receives one control message and decodes it; errors as NcclPairComm::Wait
// (`stop` ends the wait with Cancelled) or DecodeNcclControl. REQUIRES: the
// caller holds comm.exchange_mutex().
absl::StatusOr<NcclControl> RecvControl(
    NcclPairComm& comm, absl::Time deadline, absl::string_view what,
    const std::function<bool()>& stop = nullptr);

// A status (or abort) frame for transfer_id carrying `status`.
NcclControl StatusControl(KvFrameKind kind, uint64_t transfer_id,
                          const absl::Status& status);

// The status a status (or abort) frame carries.
absl::Status StatusOf(const NcclControl& c);

}  // namespace baton::nccl_kv_internal

#endif  // BATON_WORKER_TRANSPORT_NCCL_KV_INTERNAL_H_
