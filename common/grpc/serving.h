// What every Baton server process does around its services: block the
// termination signals (so a dedicated wait takes them), listen on HOST:PORT
// with the standard health service and server reflection, and report the
// address actually bound (port 0 picks a free one).
#ifndef BATON_COMMON_GRPC_SERVING_H_
#define BATON_COMMON_GRPC_SERVING_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/tls.h"

namespace baton {

// Blocks SIGINT and SIGTERM in this thread and every thread it starts
// afterwards; call first in main().
void BlockTerminationSignals();
// Waits for SIGINT or SIGTERM (after BlockTerminationSignals); returns it.
int WaitForTerminationSignal();
// As WaitForTerminationSignal, for at most `timeout`; 0 if none came.
int WaitForTerminationSignalFor(absl::Duration timeout);

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  // "HOST:PORT" with the bound port.
  std::string address;
};

// A service and its full name ("baton.v1.Baton"), the name a health check
// asks for.
struct ServedService {
  grpc::Service* service;
  std::string name;
};

// Starts a server on `listen` ("HOST:PORT") with `services`, the health
// service and reflection (which can describe every service, the health
// service's too). The health service answers SERVING for "" and for each
// service's name (NOT_SERVING when `serving` is false, until the caller
// turns it SERVING). InvalidArgument for a malformed address, Unavailable if
// it cannot listen. The services must outlive the server. A message over
// `max_receive_bytes` is refused with RESOURCE_EXHAUSTED by gRPC itself.
// With `tls` naming files the port speaks only TLS (mutual TLS when
// tls.ca is set; see common/grpc/tls.h), errors naming `tls_flag_prefix`;
// without, plaintext, and a warning on stderr if `listen` is not a
// loopback address.
absl::StatusOr<RunningServer> StartServer(
    const std::string& listen, const std::vector<ServedService>& services,
    int max_receive_bytes = 4 << 20, const TlsFiles& tls = {},
    const std::string& tls_flag_prefix = "--tls", bool serving = true);

// A plaintext server with the health service only (`--health_listen`):
// what Kubernetes' gRPC probes, which speak no TLS, can ask while the
// process's real ports take only TLS. It tells nothing else; its status
// follows a HealthStatus.
absl::StatusOr<RunningServer> StartHealthServer(const std::string& listen,
                                                bool serving);

// One process's health as every server it runs reports it: Set turns the
// grpc.health.v1 status ("" and every service) of each added server.
// Thread-safe.
class HealthStatus {
 public:
  explicit HealthStatus(bool serving) : serving_(serving) {}
  // Takes the current status at once; `server` must outlive this object's
  // last Set.
  void Add(grpc::Server* server);
  void Set(bool serving);
  bool serving();

 private:
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::HealthCheckServiceInterface*> services_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_COMMON_GRPC_SERVING_H_
