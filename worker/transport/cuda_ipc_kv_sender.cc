#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "worker/transport/cuda_ipc_kv_transport.h"
#include "worker/transport/kv_handshake.h"

namespace baton {
namespace {

// Failures that say the peer (or the path to it) is gone or stuck, or that
// it shut down (its verdict Cancelled), rather than a verdict on the data:
// the peer's pool mapping is then dropped.
bool IsPeerFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsCancelled(s);
}

}  // namespace

std::vector<CudaIpcApi::Copy> PlanCudaIpcCopies(
    std::span<const CudaIpcSourceRange> source,
    std::span<uint8_t* const> dst_chunks, uint64_t chunk_bytes) {
  std::vector<CudaIpcApi::Copy> copies;
  size_t d = 0;
  uint64_t d_off = 0;
  for (const CudaIpcSourceRange& range : source) {
    const uint8_t* src = range.data;
    uint64_t left = range.bytes;
    while (left > 0) {
      BATON_CHECK_LT(d, dst_chunks.size());
      const uint64_t take = std::min(left, chunk_bytes - d_off);
      uint8_t* dst = dst_chunks[d] + d_off;
      CudaIpcApi::Copy* last = copies.empty() ? nullptr : &copies.back();
      if (last != nullptr &&
          static_cast<const uint8_t*>(last->src) + last->bytes == src &&
          static_cast<uint8_t*>(last->dst) + last->bytes == dst) {
        last->bytes += take;
      } else {
        copies.push_back({dst, src, take});
      }
      src += take;
      left -= take;
      d_off += take;
      if (d_off == chunk_bytes) {
        ++d;
        d_off = 0;
      }
    }
  }
  BATON_CHECK(d == dst_chunks.size() && d_off == 0);
  return copies;
}

absl::StatusOr<std::unique_ptr<CudaIpcKvSender>> CudaIpcKvSender::Connect(
    CudaIpcPeerMappings* mappings, absl::string_view endpoint,
    uint64_t transfer_id, const CudaIpcKvSenderOptions& options) {
  if (mappings == nullptr) {
    return absl::InvalidArgumentError("CudaIpcKvSender: mappings is null");
  }
  absl::StatusOr<UniqueFd> fd = TcpConnect(endpoint, options.stall_timeout);
  if (!fd.ok()) {
    if (IsPeerFailure(fd.status())) mappings->EvictPeer(endpoint);
    return fd.status();
  }
  SocketIoOptions io;
  io.stall_timeout = options.stall_timeout;
  if (absl::Status s =
          ProveInvited(fd->get(), transfer_id, options.transfer_secret, io);
      !s.ok()) {
    if (IsPeerFailure(s)) mappings->EvictPeer(endpoint);
    return s;
  }
  BATON_ASSIGN_OR_RETURN(CudaIpcStreamHandle stream,
                         mappings->api().StreamCreate(mappings->device()));
  return std::unique_ptr<CudaIpcKvSender>(
      new CudaIpcKvSender(mappings, *std::move(fd), std::string(endpoint),
                          transfer_id, stream, options));
}

CudaIpcKvSender::CudaIpcKvSender(CudaIpcPeerMappings* mappings, UniqueFd fd,
                                 std::string endpoint, uint64_t transfer_id,
                                 CudaIpcStreamHandle stream,
                                 const CudaIpcKvSenderOptions& options)
    : mappings_(mappings),
      fd_(std::move(fd)),
      endpoint_(std::move(endpoint)),
      transfer_id_(transfer_id),
      options_(options),
      stream_(stream) {}

CudaIpcKvSender::~CudaIpcKvSender() {
  if (!done_) Abort(absl::CancelledError("sender destroyed before Finish"));
  CudaIpcApi& api = mappings_->api();
  if (copy_in_flight_ &&
      !WaitCudaIpcStream(api, stream_, absl::Now() + options_.stall_timeout,
                         options_.poll_interval, "a late KV copy")
           .ok()) {
    // A copy that never completes may still read the source and write the
    // peer's pool: keep its stream and mapping alive for good rather than
    // close memory under it.
    (void)new std::shared_ptr<const CudaIpcMapping>(std::move(mapping_));
    return;
  }
  api.StreamDestroy(mappings_->device(), stream_);
}

absl::Status CudaIpcKvSender::Fail(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
  fd_.Reset();
  if (IsPeerFailure(error_)) mappings_->EvictPeer(endpoint_);
  return error_;
}

absl::Status CudaIpcKvSender::AbortAfterGrant(absl::Status status) {
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  SendCudaIpcAbort(fd_.get(), transfer_id_, status, io).IgnoreError();
  return Fail(std::move(status));
}

absl::Status CudaIpcKvSender::CheckHeader(
    const KvTransferHeader& header) const {
  if (header.transfer_id != transfer_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header transfer_id ", header.transfer_id,
                     " vs this sender's ", transfer_id_));
  }
  if (header.request_id.size() > kKvMaxIdBytes ||
      header.model_id.size() > kKvMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header request_id/model_id longer than ", kKvMaxIdBytes, " bytes"));
  }
  BATON_RETURN_IF_ERROR(header.layout.Validate());
  if (header.layer < 0 || header.layer >= header.layout.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header layer ", header.layer, " not in [0, ",
                     header.layout.num_layers, ")"));
  }
  if (header.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header num_tokens must be >= 0, got ", header.num_tokens));
  }
  const int64_t blocks = KvHeaderBlocks(header);
  if (header.first_block < 0 || (header.first_block > 0 && blocks == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header first_block ", header.first_block, " leaves no block of ",
        header.num_tokens, " tokens to send"));
  }
  const uint64_t want = KvHeaderPayloadBytes(header);
  if (header.payload_bytes != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV header payload_bytes ", header.payload_bytes, " vs ", want, " for ",
        header.num_tokens, " tokens from block ", header.first_block, " (",
        blocks, " chunks of ", header.layout.chunk_bytes(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcKvSender::SendLayer(const KvTransferHeader& header,
                                        std::span<const uint8_t> payload) {
  const CudaIpcSourceRange range{payload.data(), payload.size()};
  return SendLayerFrom(header, {&range, 1}, nullptr);
}

absl::Status CudaIpcKvSender::SendLayerChunks(
    const KvTransferHeader& header,
    std::span<const std::span<const uint8_t>> chunks, KvReadGate* gate) {
  std::vector<CudaIpcSourceRange> ranges;
  ranges.reserve(chunks.size());
  for (std::span<const uint8_t> c : chunks) {
    ranges.push_back({c.data(), c.size()});
  }
  return SendLayerFrom(header, ranges, gate);
}

absl::Status CudaIpcKvSender::SendLayerFromPool(
    const KvTransferHeader& header, const KvDeviceLayerSource& source) {
  if (!error_.ok()) return error_;
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  const uint64_t chunk = header.layout.chunk_bytes();
  const int64_t blocks = static_cast<int64_t>(header.payload_bytes / chunk);
  if (source.device_pool == nullptr || source.num_blocks_total <= 0 ||
      static_cast<int64_t>(source.block_ids.size()) < blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC KV layer ", header.layer, ": source needs a device pool, ",
        "num_blocks_total > 0 (has ", source.num_blocks_total, ") and ", blocks,
        " block ids (has ", source.block_ids.size(), ")"));
  }
  std::vector<CudaIpcSourceRange> ranges(blocks);
  const uint8_t* base = static_cast<const uint8_t*>(source.device_pool);
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = source.block_ids[i];
    if (b < 0 || b >= source.num_blocks_total) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA IPC KV source block id ", b, " not in [0, ",
                       source.num_blocks_total, ")"));
    }
    ranges[i] = {
        base + (static_cast<uint64_t>(header.layer) * source.num_blocks_total +
                b) *
                   chunk,
        chunk};
  }
  return SendLayerFrom(header, ranges, nullptr);
}

absl::Status CudaIpcKvSender::SendLayerFrom(
    const KvTransferHeader& header, std::span<const CudaIpcSourceRange> source,
    KvReadGate* gate) {
  if (!error_.ok()) return error_;
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer ", transfer_id_, ": SendLayer after Finish/Abort"));
  }
  // Caller errors: nothing is sent, the transfer stays usable.
  BATON_RETURN_IF_ERROR(CheckHeader(header));
  uint64_t source_bytes = 0;
  for (const CudaIpcSourceRange& r : source) {
    if (r.data == nullptr && r.bytes > 0) {
      return absl::InvalidArgumentError("CUDA IPC KV source range is null");
    }
    source_bytes += r.bytes;
  }
  if (source_bytes != header.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV header payload_bytes ", header.payload_bytes,
                     " vs payload size ", source_bytes));
  }

  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  const std::string what =
      absl::StrCat("KV transfer ", transfer_id_, " layer ", header.layer);
  KvTransferHeader h = header;
  h.checksum = 0;
  if (absl::Status s = SendCudaIpcLayer(fd_.get(), h, io); !s.ok()) {
    // The receiver may have said why before closing.
    SocketIoOptions quick = io;
    quick.stall_timeout = absl::Milliseconds(100);
    absl::StatusOr<CudaIpcVerdict> v = ReadCudaIpcVerdict(fd_.get(), quick);
    if (v.ok() && !v->status.ok()) {
      return Fail(PrefixStatus(
          absl::StrCat("KV receiver rejected transfer ", transfer_id_, ": "),
          v->status));
    }
    return Fail(s);
  }
  absl::StatusOr<CudaIpcVerdict> verdict = ReadCudaIpcVerdict(fd_.get(), io);
  if (!verdict.ok()) {
    return Fail(PrefixStatus(absl::StrCat(what, ": "), verdict.status()));
  }
  if (verdict->transfer_id != transfer_id_) {
    return Fail(absl::InternalError(
        absl::StrCat(what, ": verdict names transfer ", verdict->transfer_id)));
  }
  if (!verdict->status.ok()) {
    return Fail(PrefixStatus(
        absl::StrCat("KV receiver rejected transfer ", transfer_id_, ": "),
        verdict->status));
  }
  // Granted: from here until "landed" (or abort) the receiver waits for
  // this layer's bytes.
  const uint64_t chunk = h.layout.chunk_bytes();
  if (verdict->grant.has_value()) {
    if (mapping_ != nullptr) {
      return AbortAfterGrant(absl::InternalError(
          absl::StrCat(what, ": receiver sent a second grant")));
    }
    const CudaIpcGrant& g = *verdict->grant;
    const uint64_t want = static_cast<uint64_t>(h.layout.num_layers) *
                          static_cast<uint64_t>(g.num_blocks_total) * chunk;
    if (g.pool_bytes != want || g.pool_offset + g.pool_bytes < g.pool_offset) {
      return AbortAfterGrant(absl::InternalError(absl::StrCat(
          what, ": receiver's pool of ", g.pool_bytes, " bytes at offset ",
          g.pool_offset, " does not hold ", h.layout.num_layers, " layers of ",
          g.num_blocks_total, " blocks of ", chunk, " bytes")));
    }
    absl::StatusOr<std::shared_ptr<const CudaIpcMapping>> mapping =
        mappings_->Open(g.handle, endpoint_);
    if (!mapping.ok()) {
      return AbortAfterGrant(
          PrefixStatus(absl::StrCat(what, ": opening the receiver's pool: "),
                       mapping.status()));
    }
    mapping_ = *std::move(mapping);
    grant_ = *std::move(verdict->grant);
  } else if (mapping_ == nullptr) {
    return AbortAfterGrant(absl::InternalError(
        absl::StrCat(what, ": receiver's first OK carries no grant")));
  }
  const int64_t blocks = static_cast<int64_t>(h.payload_bytes / chunk);
  if (static_cast<int64_t>(grant_.block_ids.size()) < blocks) {
    return AbortAfterGrant(absl::FailedPreconditionError(
        absl::StrCat(what, ": receiver granted ", grant_.block_ids.size(),
                     " blocks, ", blocks, " needed")));
  }
  // In bounds: layer < num_layers (CheckHeader), ids < num_blocks_total
  // (DecodeCudaIpcGrant), pool_bytes == num_layers * num_blocks * chunk.
  std::vector<uint8_t*> dst(blocks);
  uint8_t* const pool = mapping_->base() + grant_.pool_offset;
  for (int64_t i = 0; i < blocks; ++i) {
    dst[i] = pool + (static_cast<uint64_t>(h.layer) * grant_.num_blocks_total +
                     grant_.block_ids[i]) *
                        chunk;
  }
  const std::vector<CudaIpcApi::Copy> copies =
      PlanCudaIpcCopies(source, dst, chunk);
  if (gate != nullptr && !gate->Enter()) {
    return AbortAfterGrant(absl::CancelledError(
        absl::StrCat(what, ": the source blocks were taken back")));
  }
  CudaIpcApi& api = mappings_->api();
  absl::Status copied =
      copies.empty() ? absl::OkStatus()
                     : api.CopyBatchAsync(mappings_->device(), copies, stream_);
  if (copied.ok()) {
    copied =
        WaitCudaIpcStream(api, stream_, absl::Now() + options_.stall_timeout,
                          options_.poll_interval, what);
    if (absl::IsDeadlineExceeded(copied)) copy_in_flight_ = true;
  }
  if (gate != nullptr) gate->Exit();
  if (!copied.ok()) return AbortAfterGrant(copied);
  if (absl::Status s = SendCudaIpcLanded(fd_.get(), transfer_id_, h.layer, io);
      !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status CudaIpcKvSender::Finish() {
  if (!error_.ok()) return error_;
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer ", transfer_id_, ": Finish after Finish/Abort"));
  }
  done_ = true;
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  const absl::Status sent = SendCudaIpcFinish(fd_.get(), transfer_id_, io);
  // Even if the send failed, the receiver may have left a verdict.
  absl::StatusOr<CudaIpcVerdict> verdict = ReadCudaIpcVerdict(fd_.get(), io);
  if (!verdict.ok()) return Fail(sent.ok() ? verdict.status() : sent);
  if (verdict->transfer_id != transfer_id_ || verdict->grant.has_value()) {
    return Fail(absl::InternalError(
        absl::StrCat("KV transfer ", transfer_id_,
                     ": receiver's final verdict is out of protocol")));
  }
  if (!verdict->status.ok()) {
    return Fail(PrefixStatus(
        absl::StrCat("KV receiver failed transfer ", transfer_id_, ": "),
        verdict->status));
  }
  fd_.Reset();
  return absl::OkStatus();
}

void CudaIpcKvSender::Abort(absl::Status reason) {
  if (done_) return;
  done_ = true;
  if (reason.ok()) reason = absl::CancelledError("aborted by sender");
  if (!error_.ok()) return;  // the transfer already ended
  SocketIoOptions io;
  io.stall_timeout = options_.stall_timeout;
  SendCudaIpcAbort(fd_.get(), transfer_id_, reason, io).IgnoreError();
  error_ = PrefixStatus(
      absl::StrCat("KV transfer ", transfer_id_, " aborted: "), reason);
  fd_.Reset();
}

}  // namespace baton
