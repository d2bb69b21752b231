// TLS for every gRPC server and channel of a Baton process: plaintext when
// no file is named (the loopback demo), TLS with a certificate and key, and
// mutual TLS when a CA is named too. Files are re-read every
// `reload_interval` (gRPC's file-watcher provider), so rotated
// certificates are picked up without a restart; replace a key and its
// certificate together (write both to new names, then rename them over the
// old ones).
#ifndef BATON_COMMON_GRPC_TLS_H_
#define BATON_COMMON_GRPC_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton {

struct TlsFiles {
  // PEM certificate chain (leaf first) this process presents; a server
  // needs it, a client presents it for mutual TLS.
  std::string cert;
  // PEM private key of `cert`.
  std::string key;
  // PEM bundle of the CAs this process trusts. A server with `ca` requires
  // and verifies a client certificate signed by one of them (mutual TLS); a
  // client verifies the server's certificate (chain and host name) with it.
  std::string ca;
  // How often the files are re-read.
  absl::Duration reload_interval = absl::Seconds(60);

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Reads the named files now and checks what a handshake will need: `cert`
// and `key` set together, each parses, the key is the certificate's, the
// certificate is not expired, `ca` holds at least one certificate; a server
// needs `cert`, a client needs `ca`. InvalidArgument naming the flag prefix
// (e.g. "--control_tls") and the file otherwise. OK when nothing is named.
absl::Status CheckTlsFiles(const TlsFiles& files, bool server,
                           const std::string& flag_prefix);

// Insecure credentials when `files` names nothing; otherwise TLS (mutual
// when `files.ca` is set) from the files, re-read every reload_interval.
// Calls CheckTlsFiles first.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix = "--tls");
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files,
                       const std::string& flag_prefix = "--tls");

// True for "localhost", 127.0.0.0/8 and ::1 (with or without brackets).
bool IsLoopbackHost(const std::string& host);

}  // namespace baton

#endif  // BATON_COMMON_GRPC_TLS_H_
