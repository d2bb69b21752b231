// Host (TCP) KV transport on loopback: full transfers between two pools
// (from a contiguous buffer and in place from pool chunks, checksum given or
// hashed while sending), the checksum definition and its trailer, unknown
// transfers, concurrency and throughput.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/transport/kv_transport_test_util.h"

namespace baton {
namespace {

using namespace ::baton::kvtest;  // NOLINT(build/namespaces): test fixtures

TEST(TcpKvTransportTest, MovesEveryLayerInOrderBitExact) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/1);
  DecodeSide decode(/*num_blocks=*/40);
  decode.Expect(7, 100);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 7);
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(SendLayer(*sender, src, 7, l).ok());
  }
  ASSERT_TRUE(sender->Finish().ok());
  // Finish returns after on_done.
  EXPECT_TRUE(decode.WaitDone(7, absl::ZeroDuration()).ok());
  std::vector<int64_t> expected_order(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) expected_order[l] = l;
  EXPECT_EQ(decode.Layers(7), expected_order);
  for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(7, src, l);
}

// Reserves `table` for num_tokens tokens with out-of-order block ids:
// every block is taken one by one and given back in a shuffled order.
void ReserveShuffled(KvCache& cache, BlockTable& table, int64_t num_tokens,
                     uint32_t seed) {
  std::vector<BlockTable> singles(static_cast<size_t>(cache.num_blocks_free()));
  for (BlockTable& t : singles) ASSERT_TRUE(cache.Reserve(t, 1).ok());
  std::shuffle(singles.begin(), singles.end(), std::mt19937(seed));
  for (BlockTable& t : singles) cache.Free(t);
  ASSERT_TRUE(cache.Reserve(table, num_tokens).ok());
}

TEST(TcpKvTransportTest, ChunkSendEqualsExportBitForBit) {
  // Block size 1: 1500 chunks per layer, more than one sendmsg / recvmsg
  // takes (IOV_MAX), scattered over both pools.
  constexpr int64_t kTokens = 1500;
  KvCacheOptions o;
  o.num_layers = 4;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.block_size = 1;
  o.num_blocks = 1600;
  auto src = KvCache::Create(o);
  auto dst = KvCache::Create(o);
  ASSERT_TRUE(src.ok() && dst.ok());
  BlockTable src_table, dst_table;
  ReserveShuffled(**src, src_table, kTokens, 1);
  ReserveShuffled(**dst, dst_table, kTokens + 7, 2);
  std::mt19937 rng(3);
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int32_t b : src_table.block_ids()) {
      uint8_t* p = (*src)->LayerBlock(l, b);
      for (uint64_t i = 0; i < (*src)->chunk_bytes(); ++i) p[i] = rng();
    }
  }
  ASSERT_TRUE((*src)->SetNumTokens(src_table, kTokens).ok());
  std::mutex done_mu;
  absl::Status done = absl::UnknownError("no on_done");
  KvReceiverCallbacks cb;
  cb.lookup = [&](uint64_t) -> absl::StatusOr<KvTransferTarget> {
    KvTransferTarget t;
    t.cache = dst->get();
    t.table = &dst_table;
    t.expected_layout = (*dst)->layout();
    t.num_tokens = kTokens;
    return t;
  };
  cb.on_done = [&](uint64_t, absl::Status s) {
    std::lock_guard<std::mutex> lock(done_mu);
    done = s;
  };
  auto receiver = TcpKvReceiver::Start({}, cb);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  // sendmsg calls of 1000 bytes: chunks (64 bytes) straddle calls, and the
  // hashing runs ahead of the send by at most one call.
  auto sender = Connect(**receiver, 21, absl::Seconds(10), 1000);
  KvTransferHeader h;
  h.transfer_id = 21;
  h.request_id = "chunks";
  h.layout = (*src)->layout();
  h.num_tokens = kTokens;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    auto chunks = (*src)->LayerChunks(src_table, l, kTokens);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    ASSERT_EQ(chunks->size(), static_cast<size_t>(kTokens));
    h.layer = l;
    h.payload_bytes = (*src)->LayerBytes(src_table);
    // Even layers hashed while sending, odd ones with the checksum given.
    h.checksum = l % 2 == 0 ? 0 : KvChecksumChunks(*chunks);
    ASSERT_TRUE(sender->SendLayerChunks(h, *chunks, nullptr).ok());
  }
  ASSERT_TRUE(sender->Finish().ok());
  {
    std::lock_guard<std::mutex> lock(done_mu);
    ASSERT_TRUE(done.ok()) << done;
  }
  ASSERT_TRUE((*dst)->SetNumTokens(dst_table, kTokens).ok());
  for (int64_t l = 0; l < o.num_layers; ++l) {
    std::vector<uint8_t> a((*src)->LayerBytes(src_table));
    std::vector<uint8_t> b((*dst)->LayerBytes(dst_table));
    ASSERT_TRUE((*src)->ExportLayer(src_table, l, a).ok());
    ASSERT_TRUE((*dst)->ExportLayer(dst_table, l, b).ok());
    ASSERT_EQ(a, b) << "layer " << l;
  }
  (*src)->Free(src_table);
  (*dst)->Free(dst_table);
  EXPECT_EQ((*dst)->num_blocks_free(), (*dst)->num_blocks_total());
}

TEST(KvChecksumTest, DefinitionAndEquivalentForms) {
  std::mt19937 rng(11);
  std::vector<uint8_t> payload(7 * kChunkBytes + 100);
  for (uint8_t& b : payload) b = static_cast<uint8_t>(rng());
  // Reference: xxHash's own one-shot XXH3 per piece, then over the hashes.
  std::vector<uint8_t> hashes;
  std::vector<std::span<const uint8_t>> pieces;
  for (size_t off = 0; off < payload.size(); off += kChunkBytes) {
    const size_t n = std::min<size_t>(kChunkBytes, payload.size() - off);
    pieces.emplace_back(payload.data() + off, n);
    const uint64_t h = XXH3_64bits(payload.data() + off, n);
    for (int i = 0; i < 8; ++i)
      hashes.push_back(static_cast<uint8_t>(h >> (8 * i)));
  }
  const uint64_t expected = XXH3_64bits(hashes.data(), hashes.size());
  EXPECT_EQ(KvChecksum(payload, kChunkBytes), expected);
  EXPECT_EQ(KvChecksumChunks(pieces), expected);
  KvChecksummer sum;
  sum.AddChunk(pieces[0]);
  sum.Reset();
  for (std::span<const uint8_t> p : pieces) sum.AddChunk(p);
  EXPECT_EQ(sum.Digest(), expected);
  // Short inputs (XXH3's other code paths) agree too.
  for (size_t n : {0, 1, 16, 17, 128, 129, 240, 241}) {
    const std::span<const uint8_t> head(payload.data(), n);
    const uint64_t h = XXH3_64bits(head.data(), n);
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(h >> (8 * i));
    EXPECT_EQ(KvChecksum(head, 4096),
              n == 0 ? XXH3_64bits(nullptr, 0) : XXH3_64bits(le, 8))
        << n;
  }
  // Any flipped bit or swapped pair of chunks changes it.
  payload[3 * kChunkBytes + 5] ^= 0x10;
  EXPECT_NE(KvChecksum(payload, kChunkBytes), expected);
  payload[3 * kChunkBytes + 5] ^= 0x10;
  std::swap(pieces[1], pieces[2]);
  EXPECT_NE(KvChecksumChunks(pieces), expected);
}

TEST(KvWireTest, ChecksumTravelsInTheTrailer) {
  KvFrame f;
  f.header.transfer_id = 5;
  f.header.layout = MakeCache(1)->layout();
  f.header.num_tokens = 3 * f.header.layout.block_size;
  f.header.payload_bytes = 3 * kChunkBytes;
  f.header.checksum = 0x1122334455667788;  // not on the header
  KvFrameBytes b = EncodeKvFrame(f);
  EXPECT_EQ(b[4], 5);                                        // version
  for (size_t i = 56; i < 64; ++i) EXPECT_EQ(b[i], 0) << i;  // first_block
  auto decoded = DecodeKvFrame(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->header.checksum, 0u);
  EXPECT_EQ(decoded->header.payload_bytes, 3 * kChunkBytes);
  const KvTrailerBytes t = EncodeKvTrailer(0x1122334455667788);
  EXPECT_EQ(t[0], 0x88);
  EXPECT_EQ(t[7], 0x11);
  EXPECT_EQ(DecodeKvTrailer(t), 0x1122334455667788u);
  // A version 2 header (checksum at offset 56) is refused by field.
  b[4] = 2;
  EXPECT_THAT(DecodeKvFrame(b).status().message(), HasSubstr("version 2"));
  // first_block travels at offset 56; a layer carries at least one block.
  f.header.first_block = 2;
  b = EncodeKvFrame(f);
  EXPECT_EQ(b[56], 2);
  decoded = DecodeKvFrame(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->header.first_block, 2);
  EXPECT_EQ(KvHeaderBlocks(decoded->header), 1);
  EXPECT_EQ(KvHeaderPayloadBytes(decoded->header), kChunkBytes);
  f.header.first_block = 3;
  EXPECT_THAT(DecodeKvFrame(EncodeKvFrame(f)).status().message(),
              HasSubstr("first_block 3 must be in [0, 3)"));
  f.header.first_block = -1;
  EXPECT_THAT(DecodeKvFrame(EncodeKvFrame(f)).status().message(),
              HasSubstr("first_block -1"));
  f.kind = KvFrameKind::kFinish;
  f.header.first_block = 1;
  f.header.payload_bytes = 0;
  EXPECT_THAT(DecodeKvFrame(EncodeKvFrame(f)).status().message(),
              HasSubstr("must be 0"));
}

// Sends layers [from, kLayers) of `src` as transfer `id` and finishes it;
// then every layer has landed bit-exact.
void FinishTransferAndCheck(TcpKvSender& sender, const PrefillSide& src,
                            DecodeSide& decode, uint64_t id, int64_t from) {
  for (int64_t l = from; l < kLayers; ++l) {
    ASSERT_TRUE(SendLayer(sender, src, id, l).ok()) << l;
  }
  EXPECT_TRUE(sender.Finish().ok());
  EXPECT_TRUE(decode.WaitDone(id).ok());
  for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(id, src, l);
}

// A receiver holding the sequence's first blocks (a cached prefix) gets
// only the blocks after them: each layer's payload starts at first_block,
// lands in the reserved blocks from there on, and never touches the blocks
// before; a sender that disagrees on first_block is refused by field.
TEST(TcpKvTransportTest, PartialTransferWritesOnlyTheBlocksAfterFirstBlock) {
  constexpr int64_t kTokens = 70;  // 5 blocks
  constexpr int64_t kFirst = 3;
  PrefillSide src(64, kTokens, 9);
  DecodeSide decode(40);
  decode.Expect(31, kTokens, "", kFirst);
  decode.Expect(32, kTokens, "", kFirst);
  auto receiver = StartReceiver(decode);
  auto send = [&](KvSender& sender, uint64_t id, int64_t layer,
                  int64_t first_block) {
    KvTransferHeader h = src.Header(id, layer);
    h.first_block = first_block;
    auto chunks =
        src.cache->LayerChunks(src.table, layer, kTokens, first_block);
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    h.payload_bytes = chunks->size() * kChunkBytes;
    EXPECT_EQ(h.payload_bytes, KvHeaderPayloadBytes(h));
    return sender.SendLayerChunks(h, *chunks, nullptr);
  };
  auto sender = Connect(*receiver, 31);
  for (int64_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(send(*sender, 31, l, kFirst).ok()) << l;
  }
  ASSERT_TRUE(sender->Finish().ok());
  ASSERT_TRUE(decode.WaitDone(31).ok());
  for (int64_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(decode.Untouched(31, l, 0, kFirst)) << l;
    decode.ExpectSameKv(31, src, l, kFirst * 16);
  }
  // The whole sequence where the receiver expects the tail: refused before
  // a byte lands.
  auto whole = Connect(*receiver, 32);
  absl::Status s = send(*whole, 32, 0, 0);
  if (s.ok()) s = whole->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("first_block 0 vs expected 3"));
  EXPECT_TRUE(decode.Untouched(32, 0));
}

TEST(TcpKvTransportTest, UnknownTransferIdIsNotFound) {
  PrefillSide src(64, 20, 3);
  DecodeSide decode(40);
  auto receiver = StartReceiver(decode);
  auto sender = Connect(*receiver, 1234);
  absl::Status s = SendLayer(*sender, src, 1234, 0);
  if (s.ok()) s = sender->Finish();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  // Not a transfer of this receiver: nothing to report.
  EXPECT_FALSE(decode.Reported(1234));
}

// Only the sender holding the reservation's secret may write: a wrong
// secret is refused before any byte lands, nothing is reported, and the
// reservation stays whole for the right sender.
TEST(TcpKvTransportTest, WrongSecretIsRefusedAndLeavesTheReservationAlone) {
  PrefillSide src(64, 30, 3);
  DecodeSide decode(40);
  decode.Expect(21, 30, "the-reservation-secret");
  auto receiver = StartReceiver(decode);
  const size_t call = TcpKvSenderOptions().send_call_bytes;
  {
    auto rogue = Connect(*receiver, 21, absl::Seconds(10), call, "a-guess");
    absl::Status s = SendLayer(*rogue, src, 21, 0);
    if (s.ok()) s = rogue->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_THAT(s.message(), HasSubstr("does not match"));
  }
  EXPECT_FALSE(decode.Reported(21));
  EXPECT_TRUE(decode.Untouched(21, 0));
  auto sender =
      Connect(*receiver, 21, absl::Seconds(10), call, "the-reservation-secret");
  FinishTransferAndCheck(*sender, src, decode, 21, /*from=*/0);
}

// A second connection quoting a transfer another connection is writing,
// even with its secret, is refused without touching the first: no report,
// no freed blocks, and the first completes with every byte in place.
TEST(TcpKvTransportTest, SecondConnectionQuotingALiveTransferIsRefused) {
  PrefillSide src(64, 30, 4);
  DecodeSide decode(40);
  decode.Expect(22, 30, "s");
  auto receiver = StartReceiver(decode);
  const size_t call = TcpKvSenderOptions().send_call_bytes;
  auto first = Connect(*receiver, 22, absl::Seconds(10), call, "s");
  ASSERT_TRUE(SendLayer(*first, src, 22, 0).ok());
  // Until the receiver has claimed the transfer (layer 0 landed).
  for (int i = 0; i < 6000 && decode.Layers(22).empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(decode.Layers(22).size(), 1u);
  {
    auto second = Connect(*receiver, 22, absl::Seconds(10), call, "s");
    absl::Status s = SendLayer(*second, src, 22, 1);
    if (s.ok()) s = second->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("another connection"));
  }
  EXPECT_FALSE(decode.Reported(22));
  FinishTransferAndCheck(*first, src, decode, 22, /*from=*/1);
}

// The wire's proof: HMAC-SHA256 under the secret, bound to the nonce and
// the transfer id; any change of the three fails it.
TEST(KvWireTest, ProofBindsSecretNonceAndTransfer) {
  const KvNonce nonce = NewKvNonce();
  const KvProofBytes proof = KvProof("secret", nonce, 7);
  EXPECT_TRUE(KvProofMatches("secret", nonce, 7, proof));
  EXPECT_FALSE(KvProofMatches("secreT", nonce, 7, proof));
  EXPECT_FALSE(KvProofMatches("secret", nonce, 8, proof));
  KvNonce other = nonce;
  other[0] ^= 1;
  EXPECT_FALSE(KvProofMatches("secret", other, 7, proof));
  EXPECT_FALSE(KvProofMatches("secret", nonce, 7,
                              std::span<const uint8_t>(proof).first(31)));
  EXPECT_NE(NewKvNonce(), nonce);
  EXPECT_NE(NewKvTransferId(), NewKvTransferId());
  EXPECT_EQ(NewKvSecret().size(), kKvSecretBytes);
}

TEST(TcpKvTransportTest, FourConcurrentSenders) {
  constexpr int kSenders = 4;
  std::vector<std::unique_ptr<PrefillSide>> srcs;
  DecodeSide decode(60);
  for (int i = 0; i < kSenders; ++i) {
    srcs.push_back(std::make_unique<PrefillSide>(16 + i, 100 + 37 * i, 20 + i));
    decode.Expect(100 + i, 100 + 37 * i);
  }
  auto receiver = StartReceiver(decode);
  std::vector<absl::Status> results(kSenders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSenders; ++i) {
    threads.emplace_back([&, i] {
      auto sender = Connect(*receiver, 100 + i);
      absl::Status s;
      for (int64_t l = 0; l < kLayers && s.ok(); ++l) {
        s = SendLayer(*sender, *srcs[i], 100 + i, l);
      }
      results[i] = s.ok() ? sender->Finish() : s;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSenders; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(decode.WaitDone(100 + i).ok());
    for (int64_t l = 0; l < kLayers; ++l) {
      decode.ExpectSameKv(100 + i, *srcs[i], l);
    }
  }
}

// Each connection is served by the thread that accepted it, which hands
// listening to a new thread: finished threads are joined as new connections
// come, so sequential transfers never accumulate threads.
TEST(TcpKvTransportTest, SequentialTransfersDoNotAccumulateThreads) {
  auto threads = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                         std::filesystem::directory_iterator());
  };
  DecodeSide decode(40);
  auto receiver = StartReceiver(decode);
  const auto before = threads();
  for (uint64_t id = 300; id < 340; ++id) {
    auto sender = Connect(*receiver, id);
    // No reservation: the receiver refuses the transfer and ends the
    // connection.
    EXPECT_TRUE(absl::IsNotFound(sender->Finish())) << id;
  }
  // Finished connection threads are joined by the listener (at its next
  // wake-up, within a second): wait for that, not for a fixed time, which a
  // loaded host can outlast. Accumulating threads never get there.
  for (int i = 0; i < 600 && threads() > before + 1; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_LE(threads(), before + 1);
  receiver.reset();
  EXPECT_LT(threads(), before);
}

TEST(TcpKvTransportTest, PrintsLoopbackThroughput) {
  constexpr int64_t kTokens = 1024;
  PrefillSide src(kTokens / 16, kTokens, 9);
  DecodeSide decode(kTokens / 16 + 3);
  std::vector<std::vector<uint8_t>> layers;
  uint64_t total = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.push_back(src.Export(l));
    total += layers.back().size();
  }
  auto receiver = StartReceiver(decode);
  double best_transfer = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    decode.FreeAll();
    decode.Expect(200 + rep, kTokens);
    auto sender = Connect(*receiver, 200 + rep);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t l = 0; l < kLayers; ++l) {
      KvTransferHeader h = src.Header(200 + rep, l);  // hashed while sent
      ASSERT_TRUE(sender->SendLayer(h, layers[l]).ok());
    }
    ASSERT_TRUE(sender->Finish().ok());
    best_transfer = std::min(
        best_transfer,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
  }
  std::vector<uint8_t> dst(total);
  double best_copy = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t off = 0;
    for (const auto& layer : layers) {
      std::memcpy(dst.data() + off, layer.data(), layer.size());
      off += layer.size();
    }
    best_copy = std::min(best_copy, std::chrono::duration<double>(
                                        std::chrono::steady_clock::now() - t0)
                                        .count());
  }
  EXPECT_EQ(std::memcmp(dst.data(), layers[0].data(), layers[0].size()), 0);
  std::printf(
      "[ throughput ] %lld tokens x %lld layers = %.1f MiB: TCP loopback "
      "transfer (checksum+send+recv+verify+import) %.2f GB/s (%.2f ms), "
      "memcpy %.2f GB/s\n",
      static_cast<long long>(kTokens), static_cast<long long>(kLayers),
      total / 1048576.0, total / best_transfer / 1e9, best_transfer * 1e3,
      total / best_copy / 1e9);
}

}  // namespace
}  // namespace baton
