// gRPC keepalive for Baton's connections, client and server sides tuned
// together: a client pings a connection that has been quiet for
// `client_time` and closes it (failing every call on it with UNAVAILABLE)
// when no acknowledgement comes within `client_timeout`, so a peer whose
// host vanished without closing its sockets is noticed within
// client_time + client_timeout, even while a stream waits for data. A
// server accepts pings no closer than `server_min_ping_interval`
// (<= client_time, so Baton's own clients never earn a GOAWAY
// "too_many_pings"), and pings quiet clients itself every `server_time`.
#ifndef BATON_COMMON_GRPC_KEEPALIVE_H_
#define BATON_COMMON_GRPC_KEEPALIVE_H_

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace baton {

struct KeepaliveOptions {
  absl::Duration client_time = absl::Seconds(10);
  absl::Duration client_timeout = absl::Seconds(5);
  absl::Duration server_min_ping_interval = absl::Seconds(5);
  absl::Duration server_time = absl::Seconds(30);
  absl::Duration server_timeout = absl::Seconds(10);
};

// Sets the client side on `args` (pings also while no call is open).
void SetClientKeepalive(grpc::ChannelArguments* args,
                        const KeepaliveOptions& options = {});
// Sets the server side on `builder`.
void SetServerKeepalive(grpc::ServerBuilder* builder,
                        const KeepaliveOptions& options = {});

}  // namespace baton

#endif  // BATON_COMMON_GRPC_KEEPALIVE_H_
