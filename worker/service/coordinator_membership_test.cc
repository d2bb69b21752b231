#include "worker/service/coordinator_membership.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CoordinatorListTest, ParsesLiteralsAndNames) {
  auto entries = ParseCoordinatorList(
      "127.0.0.1:5000, [::1]:5001,coordinators.baton:50052");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].host, "127.0.0.1");
  EXPECT_EQ((*entries)[0].port, "5000");
  EXPECT_FALSE((*entries)[0].is_name);
  EXPECT_EQ((*entries)[1].host, "::1");
  EXPECT_FALSE((*entries)[1].is_name);
  EXPECT_EQ((*entries)[2].host, "coordinators.baton");
  EXPECT_TRUE((*entries)[2].is_name);
  EXPECT_THAT(ResolveCoordinator((*entries)[0]), ElementsAre("127.0.0.1:5000"));
  EXPECT_THAT(ResolveCoordinator((*entries)[1]), ElementsAre("[::1]:5001"));
}

TEST(CoordinatorListTest, RejectsWhatIsNotHostAndPort) {
  for (const char* bad : {"nohost", "host:", ":5000", "host:0", "host:65536",
                          "host:http", "a:1,b"}) {
    auto entries = ParseCoordinatorList(bad);
    ASSERT_FALSE(entries.ok()) << bad;
    EXPECT_THAT(entries.status().message(), HasSubstr("is not HOST:PORT"));
  }
  auto empty = ParseCoordinatorList("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(CoordinatorListTest, ANameStandsForItsAddressesIpv4First) {
  auto entries = ParseCoordinatorList("localhost:7000");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(ResolveCoordinator((*entries)[0]), ElementsAre("127.0.0.1:7000"));
  // RFC 6761: .invalid never resolves.
  auto missing = ParseCoordinatorList("replicas.invalid:7000");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(ResolveCoordinator((*missing)[0]).empty());
}

}  // namespace
}  // namespace baton
