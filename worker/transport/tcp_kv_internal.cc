#include "worker/transport/tcp_kv_internal.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace baton::tcp_kv_internal {

absl::Status SendStatusFrame(KvStream stream, KvFrameKind kind,
                             uint64_t transfer_id, const absl::Status& status,
                             const SocketIoOptions& io) {
  KvFrame f;
  f.kind = kind;
  f.header.transfer_id = transfer_id;
  f.status_code = static_cast<uint32_t>(status.code());
  absl::string_view msg = status.message();
  msg = msg.substr(0, kKvMaxMessageBytes);
  f.header.payload_bytes = msg.size();
  KvFrameBytes bytes = EncodeKvFrame(f);
  iovec iov[2] = {{bytes.data(), bytes.size()},
                  {const_cast<char*>(msg.data()), msg.size()}};
  return SendAllV(stream, iov, 2, io, "sending KV status frame");
}

void AppendIov(const void* base, size_t len, std::vector<iovec>* iov) {
  if (len == 0) return;
  void* p = const_cast<void*>(base);
  if (!iov->empty()) {
    iovec& last = iov->back();
    if (static_cast<uint8_t*>(last.iov_base) + last.iov_len == p) {
      last.iov_len += len;
      return;
    }
  }
  iov->push_back({p, len});
}

}  // namespace baton::tcp_kv_internal
