#include "worker/service/device_flag.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(ParseDeviceTest, AcceptsCpuAndCudaOrdinals) {
  struct Case {
    const char* text;
    DeviceSpec::Kind kind;
    int index;
  };
  for (const Case& c : {Case{"cpu", DeviceSpec::Kind::kCpu, 0},
                        Case{"cuda", DeviceSpec::Kind::kCuda, 0},
                        Case{"cuda:0", DeviceSpec::Kind::kCuda, 0},
                        Case{"cuda:7", DeviceSpec::Kind::kCuda, 7},
                        Case{"cuda:1023", DeviceSpec::Kind::kCuda, 1023}}) {
    auto spec = ParseDevice(c.text);
    ASSERT_TRUE(spec.ok()) << c.text << ": " << spec.status();
    EXPECT_EQ(spec->kind, c.kind) << c.text;
    EXPECT_EQ(spec->index, c.index) << c.text;
  }
  EXPECT_EQ(ParseDevice("cuda:3")->ToString(), "cuda:3");
  EXPECT_EQ(ParseDevice("cpu")->ToString(), "cpu");
}

TEST(ParseDeviceTest, RejectsOtherTextNamingIt) {
  for (const char* text :
       {"", "gpu", "CUDA:0", "cuda:", "cuda:-1", "cuda:+1", "cuda:x",
        "cuda:1024", "cuda:99999999999", "cuda:0 ", "cpu:0", "cuda0"}) {
    auto spec = ParseDevice(text);
    ASSERT_FALSE(spec.ok()) << "'" << text << "' was accepted";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(),
                HasSubstr(std::string("'") + text + "'"));
    EXPECT_THAT(spec.status().message(), HasSubstr("cuda:N"));
  }
}

}  // namespace
}  // namespace baton
