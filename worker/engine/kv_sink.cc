#include "worker/engine/kv_sink.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace baton {

absl::Status KvSink::SendLayerChunks(
    int64_t layer, std::span<const std::span<const uint8_t>> chunks,
    KvReadGate& gate) {
  uint64_t total = 0;
  for (std::span<const uint8_t> c : chunks) total += c.size();
  std::vector<uint8_t> bytes(total);
  if (!gate.Enter()) {
    return absl::CancelledError(absl::StrCat(
        "KV layer ", layer, ": source blocks released before the copy"));
  }
  uint64_t off = 0;
  for (std::span<const uint8_t> c : chunks) {
    if (!c.empty()) std::memcpy(bytes.data() + off, c.data(), c.size());
    off += c.size();
  }
  gate.Exit();
  return SendLayer(layer, bytes);
}

TransportKvSink::TransportKvSink(std::unique_ptr<KvSender> sender,
                                 uint64_t transfer_id, std::string model_id,
                                 const KvSinkInfo& info)
    : sender_(std::move(sender)) {
  header_.transfer_id = transfer_id;
  header_.request_id = info.request_id;
  header_.model_id = std::move(model_id);
  header_.layout = info.layout;
  header_.num_tokens = info.num_tokens;
  header_.first_block = info.first_block;
}

absl::Status TransportKvSink::SendLayer(int64_t layer,
                                        std::span<const uint8_t> bytes) {
  header_.layer = layer;
  header_.payload_bytes = bytes.size();
  header_.checksum = 0;  // computed by the sender as the bytes go out
  return sender_->SendLayer(header_, bytes);
}

absl::Status TransportKvSink::SendLayerChunks(
    int64_t layer, std::span<const std::span<const uint8_t>> chunks,
    KvReadGate& gate) {
  uint64_t total = 0;
  for (std::span<const uint8_t> c : chunks) total += c.size();
  header_.layer = layer;
  header_.payload_bytes = total;
  header_.checksum = 0;  // each chunk hashed under the gate as it goes out
  return sender_->SendLayerChunks(header_, chunks, &gate);
}

KvSinkFactory TcpKvSinkFactory(std::string endpoint, uint64_t transfer_id,
                               std::string model_id,
                               TcpKvSenderOptions options) {
  return
      [endpoint = std::move(endpoint), transfer_id,
       model_id = std::move(model_id), options](
          const KvSinkInfo& info) -> absl::StatusOr<std::unique_ptr<KvSink>> {
        BATON_ASSIGN_OR_RETURN(
            std::unique_ptr<TcpKvSender> sender,
            TcpKvSender::Connect(endpoint, transfer_id, options));
        return std::unique_ptr<KvSink>(std::make_unique<TransportKvSink>(
            std::move(sender), transfer_id, model_id, info));
      };
}

absl::Status InMemoryKvSink::SendLayer(int64_t layer,
                                       std::span<const uint8_t> bytes) {
  if (layer != static_cast<int64_t>(state_->layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", layer, " arrived, expected ", state_->layers.size()));
  }
  state_->layers.emplace_back(bytes.begin(), bytes.end());
  return absl::OkStatus();
}

absl::Status InMemoryKvSink::Finish() {
  state_->finished = true;
  return absl::OkStatus();
}

void InMemoryKvSink::Abort(absl::Status reason) {
  state_->aborted = std::move(reason);
}

}  // namespace baton
