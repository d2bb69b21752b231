#include "worker/transport/kv_transport.h"

// xxHash is compiled inline, its SSE2 kernels as the baseline; on x86-64 its
// AVX2 kernels are compiled too (XXH_DISPATCH_AVX2, the hook xxHash's own
// x86 dispatcher uses) and picked at run time. Every kernel gives the same
// hash; AVX2 is ~1.6x faster from memory and ~3x out of L2 here.
#define XXH_INLINE_ALL
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BATON_KV_XXH3_X86 1
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
// The AVX2 kernels load and store the accumulator as __m256i: align it (and
// the secret) for them, not for the SSE2 baseline's 16 bytes.
#define XXH_ACC_ALIGN 32
#endif
#include <xxhash.h>
// The AVX2 entry point below names xxHash internals as of 0.8.0 / 0.8.1.
#if defined(BATON_KV_XXH3_X86) && XXH_VERSION_NUMBER >= 800 && \
    XXH_VERSION_NUMBER < 802
#define BATON_KV_XXH3_AVX2 1
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace baton {

namespace {

#ifdef BATON_KV_XXH3_AVX2
// XXH3's long-input path (inputs over 240 bytes) with the AVX2 kernels.
// Clears the upper YMM halves before returning, so the SSE code around it
// pays no transition penalty.
__attribute__((__target__("avx2"), noinline)) XXH64_hash_t HashLongAvx2(
    const void* XXH_RESTRICT input, size_t len, XXH64_hash_t /*seed*/,
    const xxh_u8* XXH_RESTRICT /*secret*/, size_t /*secret_len*/) {
  const XXH64_hash_t h = XXH3_hashLong_64b_internal(
      input, len, XXH3_kSecret, sizeof(XXH3_kSecret), XXH3_accumulate_512_avx2,
      XXH3_scrambleAcc_avx2);
  _mm256_zeroupper();
  return h;
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

// XXH3_64bits (seed 0) of [data, data + size), on the fastest kernel.
uint64_t Xxh3(const void* data, size_t size) {
#ifdef BATON_KV_XXH3_AVX2
  if (kHasAvx2) {
    return XXH3_64bits_internal(data, size, 0, XXH3_kSecret,
                                sizeof(XXH3_kSecret), HashLongAvx2);
  }
#endif
  return XXH3_64bits(data, size);
}

void AppendHash(std::span<const uint8_t> piece, std::vector<uint8_t>* out) {
  const uint64_t h = Xxh3(piece.data(), piece.size());
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<uint8_t>(h >> (8 * i)));
}

uint64_t HashOfHashes(const std::vector<uint8_t>& hashes) {
  return Xxh3(hashes.data(), hashes.size());
}

}  // namespace

uint64_t KvChecksum(std::span<const uint8_t> payload, uint64_t chunk_bytes) {
  BATON_CHECK_GT(chunk_bytes, 0u);
  std::vector<uint8_t> hashes;
  hashes.reserve((payload.size() / chunk_bytes + 1) * 8);
  for (uint64_t off = 0; off < payload.size(); off += chunk_bytes) {
    AppendHash(payload.subspan(
                   off, std::min<uint64_t>(chunk_bytes, payload.size() - off)),
               &hashes);
  }
  return HashOfHashes(hashes);
}

uint64_t KvChecksumChunks(std::span<const std::span<const uint8_t>> chunks) {
  std::vector<uint8_t> hashes;
  hashes.reserve(chunks.size() * 8);
  for (std::span<const uint8_t> c : chunks) AppendHash(c, &hashes);
  return HashOfHashes(hashes);
}

void KvChecksummer::AddChunk(std::span<const uint8_t> chunk) {
  AppendHash(chunk, &hashes_);
}

uint64_t KvChecksummer::Digest() const { return HashOfHashes(hashes_); }

absl::Status KvSender::SendLayerChunks(
    const KvTransferHeader& header,
    std::span<const std::span<const uint8_t>> chunks, KvReadGate* gate) {
  uint64_t total = 0;
  for (std::span<const uint8_t> c : chunks) total += c.size();
  std::vector<uint8_t> payload(total);
  if (gate != nullptr && !gate->Enter()) {
    return absl::CancelledError(
        absl::StrCat("KV transfer ", header.transfer_id, " layer ",
                     header.layer, ": source memory released before the send"));
  }
  uint64_t off = 0;
  for (std::span<const uint8_t> c : chunks) {
    if (!c.empty()) std::memcpy(payload.data() + off, c.data(), c.size());
    off += c.size();
  }
  if (gate != nullptr) gate->Exit();
  return SendLayer(header, payload);
}

absl::Status PrefixStatus(absl::string_view prefix,
                          const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

absl::Status ValidateLayerHeader(const KvTransferHeader& header,
                                 const KvTransferTarget& target) {
  const std::string where =
      absl::StrCat("KV transfer ", header.transfer_id, " (request '",
                   header.request_id, "') layer ", header.layer, ": ");
  if (absl::Status s =
          CheckLayoutMatches(target.expected_layout, header.layout);
      !s.ok()) {
    return PrefixStatus(where, s);
  }
  if (!target.expected_model_id.empty() &&
      header.model_id != target.expected_model_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "model_id '", header.model_id, "' vs expected '",
                     target.expected_model_id, "'"));
  }
  if (!target.expected_request_id.empty() &&
      header.request_id != target.expected_request_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "request_id vs expected '", target.expected_request_id, "'"));
  }
  if (header.layer < 0 || header.layer >= target.expected_layout.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "layer must be in [0, ",
                     target.expected_layout.num_layers, ")"));
  }
  if (header.num_tokens != target.num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_tokens ", header.num_tokens, " vs expected ",
                     target.num_tokens));
  }
  if (header.first_block != target.first_block) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "first_block ", header.first_block, " vs expected ",
        target.first_block, " (the blocks this worker holds already)"));
  }
  const int64_t blocks =
      target.cache->BlocksNeeded(target.num_tokens) - target.first_block;
  const uint64_t expected_bytes =
      static_cast<uint64_t>(std::max<int64_t>(0, blocks)) *
      target.cache->chunk_bytes();
  if (header.payload_bytes != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "payload_bytes ", header.payload_bytes, " vs expected ",
        expected_bytes, " (", target.num_tokens, " tokens in ",
        target.cache->BlocksNeeded(target.num_tokens), " blocks, from block ",
        target.first_block, ", of ", target.cache->chunk_bytes(), " bytes)"));
  }
  return absl::OkStatus();
}

int64_t KvHeaderBlocks(const KvTransferHeader& header) {
  const int64_t block_size = header.layout.block_size;
  if (block_size < 1 || header.num_tokens < 0 || header.first_block < 0) {
    return 0;
  }
  const int64_t blocks =
      header.num_tokens / block_size + (header.num_tokens % block_size != 0);
  return std::max<int64_t>(0, blocks - header.first_block);
}

uint64_t KvHeaderPayloadBytes(const KvTransferHeader& header) {
  return static_cast<uint64_t>(KvHeaderBlocks(header)) *
         header.layout.chunk_bytes();
}

absl::StatusOr<std::vector<int32_t>> KvTargetBlockIds(
    const KvTransferTarget& target) {
  const int64_t end = target.cache->BlocksNeeded(target.num_tokens);
  const int64_t skip = target.staged ? target.first_block : 0;
  if (target.first_block < 0 || target.first_block > end ||
      target.table->num_blocks() < end - skip) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV target: reserved table holds ", target.table->num_blocks(),
        " blocks, ", end - skip, " needed for ", target.num_tokens,
        " tokens (writing blocks [", target.first_block, ", ", end, ")",
        target.staged ? " staged from block 0" : "", ")"));
  }
  const std::span<const int32_t> ids = target.table->block_ids();
  return std::vector<int32_t>(ids.begin() + (target.first_block - skip),
                              ids.begin() + (end - skip));
}

absl::StatusOr<std::vector<std::span<uint8_t>>> KvTargetLayerChunks(
    const KvTransferTarget& target, int64_t layer) {
  if (!target.staged) {
    return target.cache->MutableLayerChunks(
        *target.table, layer, target.num_tokens, target.first_block);
  }
  return target.cache->MutableLayerChunks(
      *target.table, layer,
      target.num_tokens - target.first_block * target.cache->block_size(),
      /*first_block=*/0);
}

void KvLayerProgress::Start(uint64_t transfer_id, int64_t num_layers) {
  transfer_id_ = transfer_id;
  landed_.assign(static_cast<size_t>(std::max<int64_t>(0, num_layers)), false);
  num_landed_ = 0;
  seen_layer_ = false;
  request_id_.clear();
}

absl::Status KvLayerProgress::CheckLayer(const KvTransferHeader& header,
                                         const KvTransferTarget& target) {
  if (!seen_layer_) {
    seen_layer_ = true;
    request_id_ = header.request_id;
  }
  if (header.request_id != request_id_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV transfer ", transfer_id_, ": request_id '", header.request_id,
        "' vs '", request_id_, "' of its earlier layers"));
  }
  BATON_RETURN_IF_ERROR(ValidateLayerHeader(header, target));
  if (header.layer >= static_cast<int64_t>(landed_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("KV transfer ", transfer_id_,
                                                   ": layer ", header.layer,
                                                   " of ", landed_.size()));
  }
  if (landed_[static_cast<size_t>(header.layer)]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV transfer ", transfer_id_, ": layer ", header.layer, " sent twice"));
  }
  return absl::OkStatus();
}

void KvLayerProgress::Landed(int64_t layer) {
  std::vector<bool>::reference landed = landed_.at(static_cast<size_t>(layer));
  if (!landed) ++num_landed_;
  landed = true;
}

absl::Status KvLayerProgress::CheckComplete() const {
  for (size_t l = 0; l < landed_.size(); ++l) {
    if (!landed_[l]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KV transfer ", transfer_id_, " finished with ", num_landed_, " of ",
          landed_.size(), " layers; layer ", l, " is missing"));
    }
  }
  return absl::OkStatus();
}

std::string KvLayerProgress::Describe() const {
  return absl::StrCat("KV transfer ", transfer_id_, " after ", num_landed_,
                      " of ", landed_.size(), " layers");
}

}  // namespace baton
