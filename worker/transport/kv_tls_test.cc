// TLS on the host KV transport (kv_tls.h): transfers arrive bit-exact over
// mutual TLS and a pooled connection keeps its session; a sender in the
// clear, with a certificate of another CA or an expired one, is refused
// before it can claim or write anything; a sender refuses a receiver whose
// certificate it cannot verify; rotated files apply to new connections.
#include "worker/transport/kv_tls.h"

#include <map>

#include "common/testing/test_pki.h"
#include "worker/transport/kv_transport_test_util.h"

namespace baton {
namespace {

using namespace ::baton::kvtest;  // NOLINT(build/namespaces): test fixtures
using ::baton::testing::TestCa;
using ::testing::HasSubstr;

class KvTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = testing::TempDir::Create("kv_tls_test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    temp_dir_ = std::move(*dir);
    dir_ = temp_dir_.path();
    for (const char* name : {"cluster", "other"}) {
      auto ca = TestCa::Create(absl::StrCat(name, " CA"));
      ASSERT_TRUE(ca.ok()) << ca.status();
      cas_[name] = std::move(*ca);
    }
  }

  // Files under `prefix`: a certificate for `name` issued by CA `issuer`
  // (expired when `expired`), and CA `trusted` as the bundle.
  KvTlsFiles Files(const std::string& prefix, const std::string& issuer,
                   const std::string& trusted, bool expired = false) {
    auto leaf = expired ? cas_[issuer]->Issue(prefix, absl::Hours(-48),
                                              absl::Hours(-24))
                        : cas_[issuer]->Issue(prefix);
    EXPECT_TRUE(leaf.ok()) << leaf.status();
    KvTlsFiles files{absl::StrCat(dir_, "/", prefix, ".crt"),
                     absl::StrCat(dir_, "/", prefix, ".key"),
                     absl::StrCat(dir_, "/", prefix, ".ca")};
    EXPECT_TRUE(testing::WriteFileAtomically(files.cert, leaf->cert).ok());
    EXPECT_TRUE(testing::WriteFileAtomically(files.key, leaf->key).ok());
    EXPECT_TRUE(
        testing::WriteFileAtomically(files.ca, cas_[trusted]->cert_pem()).ok());
    files.reload_interval = absl::Milliseconds(1);
    return files;
  }

  static std::shared_ptr<KvTls> Tls(const KvTlsFiles& files) {
    auto tls = KvTls::Create(files);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return tls.ok() ? *tls : nullptr;
  }

  static std::unique_ptr<TcpKvReceiver> StartTlsReceiver(
      DecodeSide& decode, std::shared_ptr<KvTls> tls) {
    TcpKvReceiverOptions o;
    o.tls = std::move(tls);
    auto r = TcpKvReceiver::Start(o, decode.Callbacks());
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(r).value();
  }

  static absl::StatusOr<std::unique_ptr<TcpKvSender>> Sender(
      const TcpKvReceiver& r, uint64_t id, const std::string& secret,
      std::shared_ptr<KvTls> tls,
      std::shared_ptr<TcpKvConnectionPool> pool = nullptr) {
    TcpKvSenderOptions o;
    o.transfer_secret = secret;
    o.tls = std::move(tls);
    o.pool = std::move(pool);
    // Small calls: frames, ids and chunks are gathered into records and
    // split across calls.
    o.send_call_bytes = 3000;
    return TcpKvSender::Connect(r.endpoint(), id, o);
  }

  static void Transfer(TcpKvSender& sender, const PrefillSide& src,
                       DecodeSide& decode, uint64_t id) {
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(SendLayer(sender, src, id, l).ok());
    }
    ASSERT_TRUE(sender.Finish().ok());
    EXPECT_TRUE(decode.WaitDone(id, absl::ZeroDuration()).ok());
    for (int64_t l = 0; l < kLayers; ++l) decode.ExpectSameKv(id, src, l);
  }

  baton::testing::TempDir temp_dir_;  // removed with the fixture
  std::string dir_;
  std::map<std::string, std::unique_ptr<TestCa>> cas_;
};

TEST_F(KvTlsTest, MovesEveryLayerBitExactOverOnePooledConnection) {
  PrefillSide src(/*num_blocks=*/64, /*num_tokens=*/100, /*seed=*/1);
  DecodeSide decode(/*num_blocks=*/40);
  decode.Expect(7, 100, "s7");
  decode.Expect(8, 100, "s8");
  auto receiver =
      StartTlsReceiver(decode, Tls(Files("receiver", "cluster", "cluster")));
  auto tls = Tls(Files("sender", "cluster", "cluster"));
  auto pool = std::make_shared<TcpKvConnectionPool>();
  for (uint64_t id : {7, 8}) {
    auto sender = Sender(*receiver, id, absl::StrCat("s", id), tls, pool);
    ASSERT_TRUE(sender.ok()) << sender.status();
    Transfer(**sender, src, decode, id);
    // The connection went back to the pool with its TLS session, and the
    // second transfer took it from there.
    EXPECT_EQ(pool->idle_count(), 1u);
    EXPECT_EQ(receiver->num_connections(), 1);
  }
  decode.FreeAll();
}

TEST_F(KvTlsTest, RefusesSendersWithoutACertificateOfItsCa) {
  PrefillSide src(64, 30, 2);
  DecodeSide decode(40);
  decode.Expect(9, 30, "s9");
  auto receiver =
      StartTlsReceiver(decode, Tls(Files("receiver", "cluster", "cluster")));
  // In the clear: the receiver closes the connection at the handshake.
  auto plain = Sender(*receiver, 9, "s9", nullptr);
  EXPECT_FALSE(plain.ok());
  // A certificate from another CA, or an expired one from the right CA:
  // the receiver ends the session before the hello is read.
  for (const KvTlsFiles& files :
       {Files("foreign", "other", "cluster"),
        Files("expired", "cluster", "cluster", /*expired=*/true)}) {
    auto refused = Sender(*receiver, 9, "s9", Tls(files));
    ASSERT_FALSE(refused.ok()) << files.cert;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated)
        << refused.status();
  }
  // Nothing was claimed, reported or written: the real sender still
  // completes the transfer.
  EXPECT_FALSE(decode.Reported(9));
  EXPECT_TRUE(decode.Untouched(9, 0));
  auto sender =
      Sender(*receiver, 9, "s9", Tls(Files("sender", "cluster", "cluster")));
  ASSERT_TRUE(sender.ok()) << sender.status();
  Transfer(**sender, src, decode, 9);
  decode.FreeAll();
}

TEST_F(KvTlsTest, SenderRefusesAReceiverItCannotVerify) {
  DecodeSide decode(40);
  decode.Expect(10, 30, "s10");
  // The receiver's certificate is from a CA the sender does not trust.
  auto receiver =
      StartTlsReceiver(decode, Tls(Files("receiver", "other", "cluster")));
  auto sender =
      Sender(*receiver, 10, "s10", Tls(Files("sender", "cluster", "cluster")));
  ASSERT_FALSE(sender.ok());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(sender.status().message(), HasSubstr("certificate"));
  EXPECT_FALSE(decode.Reported(10));
  decode.FreeAll();
}

TEST_F(KvTlsTest, RotatedFilesApplyToNewConnections) {
  PrefillSide src(64, 30, 3);
  DecodeSide decode(40);
  decode.Expect(11, 30, "s11");
  decode.Expect(12, 30, "s12");
  const KvTlsFiles receiver_files = Files("receiver", "cluster", "cluster");
  auto receiver = StartTlsReceiver(decode, Tls(receiver_files));
  const auto cluster_sender = Tls(Files("sender", "cluster", "cluster"));
  auto first = Sender(*receiver, 11, "s11", cluster_sender);
  ASSERT_TRUE(first.ok()) << first.status();
  Transfer(**first, src, decode, 11);

  // The receiver's files move to the other CA (renamed over the old ones).
  const KvTlsFiles rotated = Files("rotated", "other", "other");
  for (auto [from, to] : {std::pair{rotated.cert, receiver_files.cert},
                          std::pair{rotated.key, receiver_files.key},
                          std::pair{rotated.ca, receiver_files.ca}}) {
    ASSERT_EQ(std::rename(from.c_str(), to.c_str()), 0) << from;
  }
  // Past the 1 ms reload interval, a new connection sees the new files:
  // the old CA's sender is refused, the new CA's is served.
  absl::SleepFor(absl::Milliseconds(10));
  auto stale = Sender(*receiver, 12, "s12", cluster_sender);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kUnauthenticated);
  auto second =
      Sender(*receiver, 12, "s12", Tls(Files("sender2", "other", "other")));
  ASSERT_TRUE(second.ok()) << second.status();
  Transfer(**second, src, decode, 12);
  decode.FreeAll();
}

TEST_F(KvTlsTest, MissingOrMismatchedFilesNameTheFlag) {
  KvTlsFiles files = Files("receiver", "cluster", "cluster");
  KvTlsFiles no_ca = files;
  no_ca.ca.clear();
  EXPECT_THAT(KvTls::Create(no_ca).status().message(),
              HasSubstr("--kv_tls needs --tls_cert, --tls_key and --tls_ca"));
  KvTlsFiles wrong_key = files;
  wrong_key.key = Files("other-leaf", "cluster", "cluster").key;
  auto mismatched = KvTls::Create(wrong_key);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("--tls_key"));
  KvTlsFiles missing = files;
  missing.cert = dir_ + "/no-such.crt";
  EXPECT_THAT(KvTls::Create(missing).status().message(),
              HasSubstr("--tls_cert"));
}

}  // namespace
}  // namespace baton
