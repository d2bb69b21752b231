#include "worker/transport/nccl_kv_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <span>
#include <string>

#include "common/status_macros.h"

namespace baton {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);

namespace nccl_kv_internal {

absl::Status SendControl(NcclPairComm& comm, const NcclControl& control,
                         absl::Time deadline, absl::string_view what) {
  EncodeNcclControl(control, std::span<uint8_t, kNcclControlBytes>(
                                 comm.host_send_control(), kNcclControlBytes));
  BATON_RETURN_IF_ERROR(comm.CopyAsync(
      comm.device_send_control(), comm.host_send_control(), kNcclControlBytes));
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kSend,
                          comm.device_send_control(), kNcclControlBytes};
  BATON_RETURN_IF_ERROR(comm.P2pGroup({&op, 1}));
  return comm.Wait(deadline, what);
}

absl::StatusOr<NcclControl> RecvControl(NcclPairComm& comm, absl::Time deadline,
                                        absl::string_view what,
                                        const std::function<bool()>& stop) {
  const NcclApi::P2pOp op{NcclApi::P2pOp::Kind::kRecv,
                          comm.device_recv_control(), kNcclControlBytes};
  BATON_RETURN_IF_ERROR(comm.P2pGroup({&op, 1}));
  BATON_RETURN_IF_ERROR(comm.CopyAsync(
      comm.host_recv_control(), comm.device_recv_control(), kNcclControlBytes));
  BATON_RETURN_IF_ERROR(comm.Wait(deadline, what, stop));
  return DecodeNcclControl(std::span<const uint8_t, kNcclControlBytes>(
      comm.host_recv_control(), kNcclControlBytes));
}

NcclControl StatusControl(KvFrameKind kind, uint64_t transfer_id,
                          const absl::Status& status) {
  NcclControl c;
  c.frame.kind = kind;
  c.frame.header.transfer_id = transfer_id;
  c.frame.status_code = static_cast<uint32_t>(status.code());
  c.message = std::string(status.message());
  return c;
}

absl::Status StatusOf(const NcclControl& c) {
  if (c.frame.status_code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(c.frame.status_code),
                      c.message);
}

}  // namespace nccl_kv_internal

}  // namespace baton
