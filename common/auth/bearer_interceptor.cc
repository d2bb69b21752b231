#include "common/auth/bearer_interceptor.h"

#include <utility>

#include "common/auth/api_keys.h"
#include "common/grpc/keepalive.h"

namespace baton {
namespace {

namespace gx = grpc::experimental;

class BearerInterceptor final : public gx::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            gx::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const value_;  // owned by the factory (the channel's)
};

class BearerInterceptorFactory final
    : public gx::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& key)
      : value_(BearerValue(key)) {}
  gx::Interceptor* CreateClientInterceptor(gx::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

InterceptorFactories BearerInterceptors(const std::string& key) {
  InterceptorFactories factories;
  if (!key.empty()) {
    factories.push_back(std::make_unique<BearerInterceptorFactory>(key));
  }
  return factories;
}

std::shared_ptr<grpc::Channel> CreateChannelWithKey(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& key, const grpc::ChannelArguments& args) {
  return gx::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                 BearerInterceptors(key));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const std::string& target, const ClientSecurity& security,
    const grpc::ChannelArguments& args) {
  auto credentials = MakeChannelCredentials(security.tls, "--tls");
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments with_keepalive = args;
  SetClientKeepalive(&with_keepalive);
  return CreateChannelWithKey(target, *credentials, security.api_key,
                              with_keepalive);
}

}  // namespace baton
