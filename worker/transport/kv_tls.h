// TLS on the host KV transport's connections (baton-worker --kv_tls):
// TLS 1.3 with a certificate on both sides, against an attacker on the path
// between a prefill and a decode worker. The receiver presents its
// certificate and requires one from the sender; each verifies the other's
// chain against the same CA bundle, and the sender also checks that the
// receiver's certificate names the host it connected to (DNS name or IP
// address). The workers' control-plane files serve (--tls_cert, --tls_key,
// --tls_ca); they are re-read when they change, looked at once per
// reload_interval, so rotated certificates apply to new connections without
// a restart. The per-transfer proof (kv_handshake.h) still runs inside TLS:
// TLS says which worker is at the other end, the proof which reservation it
// may write.
#ifndef BATON_WORKER_TRANSPORT_KV_TLS_H_
#define BATON_WORKER_TRANSPORT_KV_TLS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/socket_io.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace baton {

struct KvTlsFiles {
  std::string cert;  // PEM certificate chain this worker presents
  std::string key;   // PEM private key of `cert`
  std::string ca;    // PEM bundle the peer's certificate must chain to
  absl::Duration reload_interval = absl::Seconds(60);
};

class KvTls {
 public:
  // Reads the three files now. InvalidArgument naming the file when one is
  // missing or unreadable, or the key is not the certificate's.
  static absl::StatusOr<std::shared_ptr<KvTls>> Create(const KvTlsFiles& files);
  ~KvTls();
  KvTls(const KvTls&) = delete;
  KvTls& operator=(const KvTls&) = delete;

  // The receiver's handshake on an accepted socket. Unauthenticated naming
  // what failed (no certificate, wrong CA, expired, not TLS at all).
  absl::StatusOr<UniqueSsl> Accept(int fd, const SocketIoOptions& io);
  // The sender's handshake on a connected socket to `host`.
  absl::StatusOr<UniqueSsl> Connect(int fd, absl::string_view host,
                                    const SocketIoOptions& io);

 private:
  struct Contexts;
  explicit KvTls(const KvTlsFiles& files);
  // The contexts for a new connection, rebuilt first if a file changed
  // (checked at most once per reload_interval; a set that fails to load
  // keeps the previous one).
  std::shared_ptr<const Contexts> Current();

  const KvTlsFiles files_;
  absl::Mutex mu_;
  std::shared_ptr<const Contexts> contexts_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);  // the files' sizes and mtimes
  absl::Time next_look_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_TRANSPORT_KV_TLS_H_
