#include "worker/transport/nccl_kv_wire.h"

#include <algorithm>
#include <span>
#include <string>

#include "common/status_macros.h"

namespace baton {

static_assert(kKvFrameHeaderBytes + 2 * kKvMaxIdBytes + kKvMaxMessageBytes <=
              kNcclControlBytes);

void EncodeNcclControl(const NcclControl& control,
                       std::span<uint8_t, kNcclControlBytes> out) {
  std::fill(out.begin(), out.end(), 0);
  KvFrame frame = control.frame;
  const bool has_message =
      frame.kind == KvFrameKind::kStatus || frame.kind == KvFrameKind::kAbort;
  const size_t message_bytes =
      has_message ? std::min(control.message.size(), kKvMaxMessageBytes) : 0;
  if (has_message) frame.header.payload_bytes = message_bytes;
  const KvFrameBytes head = EncodeKvFrame(frame);
  uint8_t* p = std::copy(head.begin(), head.end(), out.data());
  if (frame.kind == KvFrameKind::kLayer) {
    p = std::copy(frame.header.request_id.begin(),
                  frame.header.request_id.end(), p);
    std::copy(frame.header.model_id.begin(), frame.header.model_id.end(), p);
  } else if (has_message) {
    std::copy_n(control.message.begin(), message_bytes, p);
  }
}

absl::StatusOr<NcclControl> DecodeNcclControl(
    std::span<const uint8_t, kNcclControlBytes> in) {
  NcclControl c;
  BATON_ASSIGN_OR_RETURN(c.frame,
                         DecodeKvFrame(in.first<kKvFrameHeaderBytes>()));
  const char* p =
      reinterpret_cast<const char*>(in.data()) + kKvFrameHeaderBytes;
  if (c.frame.kind == KvFrameKind::kLayer) {
    c.frame.header.request_id.assign(p, c.frame.request_id_bytes);
    c.frame.header.model_id.assign(p + c.frame.request_id_bytes,
                                   c.frame.model_id_bytes);
  } else if (c.frame.kind == KvFrameKind::kStatus ||
             c.frame.kind == KvFrameKind::kAbort) {
    c.message.assign(p, c.frame.header.payload_bytes);
  }
  return c;
}

}  // namespace baton
