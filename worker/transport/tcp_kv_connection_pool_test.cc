#include "worker/transport/tcp_kv_connection_pool.h"

#include <sys/socket.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/transport/kv_transport_test_util.h"
#include "worker/transport/tcp_kv_transport.h"

namespace baton::kvtest {
namespace {

// Sends every layer of `src` as transfer `id` through a sender on `pool`;
// the transfer's final status.
absl::Status Transfer(const KvReceiver& receiver, const PrefillSide& src,
                      uint64_t id,
                      const std::shared_ptr<TcpKvConnectionPool>& pool) {
  TcpKvSenderOptions o;
  o.pool = pool;
  auto sender = TcpKvSender::Connect(receiver.endpoint(), id, o);
  if (!sender.ok()) return sender.status();
  for (int64_t l = 0; l < kLayers; ++l) {
    if (absl::Status s = SendLayer(**sender, src, id, l); !s.ok()) return s;
  }
  return (*sender)->Finish();
}

// A receiver with `ro`, and transfer 1 (40 tokens) sent to it through
// `pool`, which then holds its connection; null on a failure.
std::unique_ptr<TcpKvReceiver> WithOnePooledConnection(
    const TcpKvReceiverOptions& ro, DecodeSide& decode, const PrefillSide& src,
    const std::shared_ptr<TcpKvConnectionPool>& pool) {
  auto receiver = TcpKvReceiver::Start(ro, decode.Callbacks());
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  if (!receiver.ok()) return nullptr;
  decode.Expect(1, 40);
  const absl::Status sent = Transfer(**receiver, src, 1, pool);
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(pool->idle_count(), 1u);
  if (!sent.ok()) return nullptr;
  return std::move(*receiver);
}

TEST(TcpKvConnectionPoolTest, TransfersShareOneConnection) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/3);
  DecodeSide decode(/*num_blocks=*/64);
  auto receiver = StartReceiver(decode);
  auto pool = std::make_shared<TcpKvConnectionPool>();
  for (uint64_t id = 1; id <= 3; ++id) {
    decode.Expect(id, 100);
    ASSERT_TRUE(Transfer(*receiver, src, id, pool).ok()) << id;
    EXPECT_TRUE(decode.WaitDone(id).ok());
    for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(id, src, l);
    // The connection went back to the pool and is taken again next time.
    EXPECT_EQ(pool->idle_count(), 1u);
  }
  bool reused = false;
  auto fd = pool->Acquire(receiver->endpoint(), absl::Seconds(1), 0, &reused);
  ASSERT_TRUE(fd.ok());
  EXPECT_TRUE(reused);
}

TEST(TcpKvConnectionPoolTest, RejectedTransferClosesItsConnection) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/4);
  DecodeSide decode(/*num_blocks=*/64);
  auto receiver = StartReceiver(decode);
  auto pool = std::make_shared<TcpKvConnectionPool>();
  // No reservation for transfer 9: the receiver rejects it with NotFound.
  const absl::Status s = Transfer(*receiver, src, 9, pool);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(pool->idle_count(), 0u);
  // A later transfer connects afresh and lands.
  decode.Expect(10, 100);
  EXPECT_TRUE(Transfer(*receiver, src, 10, pool).ok());
  EXPECT_EQ(pool->idle_count(), 1u);
}

TEST(TcpKvConnectionPoolTest, ConnectionTheReceiverClosedIsNotReused) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/40, /*seed=*/5);
  DecodeSide decode(/*num_blocks=*/64);
  TcpKvReceiverOptions ro;
  ro.idle_timeout = absl::Milliseconds(100);
  ro.stall_timeout = absl::Milliseconds(100);
  auto pool = std::make_shared<TcpKvConnectionPool>();
  auto receiver = WithOnePooledConnection(ro, decode, src, pool);
  ASSERT_NE(receiver, nullptr);
  // The receiver closes the idle connection after 100 ms: wait until it has.
  for (int i = 0; i < 6000 && receiver->num_connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(receiver->num_connections(), 0);
  bool reused = true;
  auto fd = pool->Acquire(receiver->endpoint(), absl::Seconds(1), 0, &reused);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_FALSE(reused);
  EXPECT_EQ(pool->idle_count(), 0u);
  // Transfers still land on the fresh connections.
  decode.Expect(2, 40);
  EXPECT_TRUE(Transfer(*receiver, src, 2, pool).ok());
}

// Peers that connect and send nothing cannot hold every slot: a new
// connection takes the place of the oldest on which nothing was proved, and
// a pooled connection that proved a transfer keeps its place.
TEST(TcpKvConnectionPoolTest, ConnectionsThatProveNothingCannotHoldEverySlot) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/40, /*seed=*/6);
  DecodeSide decode(/*num_blocks=*/64);
  TcpKvReceiverOptions ro;
  ro.max_connections = 4;
  auto pool = std::make_shared<TcpKvConnectionPool>();
  auto receiver = WithOnePooledConnection(ro, decode, src, pool);
  ASSERT_NE(receiver, nullptr);
  // Twice as many silent connections as there are slots.
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 8; ++i) {
    auto fd = TcpConnect(receiver->endpoint(), absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << fd.status();
    silent.push_back(std::move(*fd));
  }
  for (int i = 0; i < 500 && receiver->num_connections() < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LE(receiver->num_connections(), 4);
  // The pooled connection is still open (the pool drops one the receiver
  // closed, ConnectionTheReceiverClosedIsNotReused).
  absl::SleepFor(absl::Milliseconds(100));
  bool reused = false;
  auto pooled =
      pool->Acquire(receiver->endpoint(), absl::Seconds(1), 0, &reused);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_TRUE(reused);
  // A sender with no pooled connection gets a slot too.
  decode.Expect(3, 40);
  EXPECT_TRUE(
      Transfer(*receiver, src, 3, std::make_shared<TcpKvConnectionPool>())
          .ok());
  EXPECT_TRUE(decode.WaitDone(3).ok());
  for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(3, src, l);
}

TEST(TcpKvConnectionPoolTest, OldIdleConnectionsExpireAndTheListIsBounded) {
  int port = 0;
  auto listener = TcpListen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok());
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  TcpKvConnectionPoolOptions o;
  o.max_idle_per_endpoint = 2;
  o.max_idle = absl::Milliseconds(50);
  TcpKvConnectionPool pool(o);
  for (int i = 0; i < 3; ++i) {
    auto fd = pool.Acquire(endpoint, absl::Seconds(1), 0);
    ASSERT_TRUE(fd.ok()) << fd.status();
    pool.Release(endpoint, std::move(fd).value());
    // Acquire takes the idle one back each time: one connection in all.
    EXPECT_EQ(pool.idle_count(), 1u);
  }
  auto a = pool.Acquire(endpoint, absl::Seconds(1), 0);
  auto b = pool.Acquire(endpoint, absl::Seconds(1), 0);
  auto c = pool.Acquire(endpoint, absl::Seconds(1), 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  pool.Release(endpoint, std::move(a).value());
  pool.Release(endpoint, std::move(b).value());
  pool.Release(endpoint, std::move(c).value());
  EXPECT_EQ(pool.idle_count(), 2u);  // the oldest was closed
  absl::SleepFor(absl::Milliseconds(100));
  bool reused = true;
  auto d = pool.Acquire(endpoint, absl::Seconds(1), 0, &reused);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(reused);  // both idle ones were past max_idle
  EXPECT_EQ(pool.idle_count(), 0u);
}

}  // namespace
}  // namespace baton::kvtest
