#include "common/grpc/keepalive.h"

namespace baton {
namespace {

int Ms(absl::Duration d) {
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

}  // namespace

void SetClientKeepalive(grpc::ChannelArguments* args,
                        const KeepaliveOptions& options) {
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Ms(options.client_time));
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(options.client_timeout));
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging while a stream waits for data (0: no limit).
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

void SetServerKeepalive(grpc::ServerBuilder* builder,
                        const KeepaliveOptions& options) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              Ms(options.server_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              Ms(options.server_timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Ms(options.server_min_ping_interval));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace baton
