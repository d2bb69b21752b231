#include "common/grpc/serving.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/keepalive.h"
#include "grpc/health/v1/health.pb.h"

namespace baton {
namespace {

sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// The HOST of "HOST:PORT" (port 0 to 65535); InvalidArgument otherwise.
absl::StatusOr<std::string> ListenHost(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", listen, "' is not HOST:PORT"));
  }
  return listen.substr(0, colon);
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForTerminationSignal() {
  const sigset_t signals = TerminationSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

int WaitForTerminationSignalFor(absl::Duration timeout) {
  const sigset_t signals = TerminationSignals();
  const timespec limit =
      absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  while (true) {
    const int signal_number = sigtimedwait(&signals, nullptr, &limit);
    if (signal_number > 0) return signal_number;
    if (errno != EINTR) return 0;  // EAGAIN: the time ran out
  }
}

absl::StatusOr<RunningServer> StartServer(
    const std::string& listen, const std::vector<ServedService>& services,
    int max_receive_bytes, const TlsFiles& tls,
    const std::string& tls_flag_prefix, bool serving) {
  absl::StatusOr<std::string> listen_host = ListenHost(listen);
  if (!listen_host.ok()) return listen_host.status();
  auto credentials = MakeServerCredentials(tls, tls_flag_prefix);
  if (!credentials.ok()) return credentials.status();
  const std::string& host = *listen_host;
  if (!tls.enabled() && !IsLoopbackHost(host)) {
    std::fprintf(stderr,
                 "warning: %s serves plaintext gRPC on a non-loopback "
                 "address: anyone who can reach it can call it (set %s_cert "
                 "and %s_key; see docs/security.md)\n",
                 listen.c_str(), tls_flag_prefix.c_str(),
                 tls_flag_prefix.c_str());
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Reflection describes what the generated pool holds; referencing the
  // health messages links their descriptors in.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  SetServerKeepalive(&builder);
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  for (const ServedService& s : services) builder.RegisterService(s.service);
  RunningServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  grpc::HealthCheckServiceInterface* health =
      running.server->GetHealthCheckService();
  for (const ServedService& s : services) {
    health->SetServingStatus(s.name, serving);
  }
  if (!serving) health->SetServingStatus(false);
  running.address = absl::StrCat(host, ":", port);
  return running;
}

absl::StatusOr<RunningServer> StartHealthServer(const std::string& listen,
                                                bool serving) {
  absl::StatusOr<std::string> host = ListenHost(listen);
  if (!host.ok()) return host.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  SetServerKeepalive(&builder);
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  RunningServer running;
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  running.server->GetHealthCheckService()->SetServingStatus(serving);
  running.address = absl::StrCat(*host, ":", port);
  return running;
}

void HealthStatus::Add(grpc::Server* server) {
  absl::MutexLock lock(&mu_);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(serving_);
  services_.push_back(health);
}

void HealthStatus::Set(bool serving) {
  absl::MutexLock lock(&mu_);
  serving_ = serving;
  for (grpc::HealthCheckServiceInterface* h : services_) {
    h->SetServingStatus(serving);
  }
}

bool HealthStatus::serving() {
  absl::MutexLock lock(&mu_);
  return serving_;
}

}  // namespace baton
