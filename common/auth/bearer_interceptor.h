// A client interceptor that puts "authorization: Bearer KEY" on every call
// of a channel: how clients of the public plane (the CLI, baton-bench, the
// coordinator's own HTTP gateway) send an API key, over TLS or plaintext.
#ifndef BATON_COMMON_AUTH_BEARER_INTERCEPTOR_H_
#define BATON_COMMON_AUTH_BEARER_INTERCEPTOR_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc/tls.h"

namespace baton {

using InterceptorFactories = std::vector<
    std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>;

// One factory adding the key's header; none for an empty key.
InterceptorFactories BearerInterceptors(const std::string& key);

// A channel to `target` with `credentials` whose calls carry `key` (none
// when empty).
std::shared_ptr<grpc::Channel> CreateChannelWithKey(
    const std::string& target,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& key,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

// How a client reaches the public plane (baton CLI, baton-bench).
struct ClientSecurity {
  // Client-side TLS: `ca` verifies the server; `cert`/`key` are presented
  // to a server that asks for them (--tls_client_ca). Empty: plaintext.
  TlsFiles tls;
  // Sent as "authorization: Bearer KEY" on every call; empty: none.
  std::string api_key;
};

// A channel to `target` with `security` and Baton's client keepalive
// (common/grpc/keepalive.h); InvalidArgument naming the --tls
// flag whose file is missing or unusable.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const std::string& target, const ClientSecurity& security,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace baton

#endif  // BATON_COMMON_AUTH_BEARER_INTERCEPTOR_H_
