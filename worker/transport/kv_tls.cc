#include "worker/transport/kv_tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/status_macros.h"

namespace baton {
namespace {

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using UniqueCtx = std::unique_ptr<SSL_CTX, CtxFree>;

// A socket BIO that sends with MSG_NOSIGNAL (OpenSSL's own writes with
// write(2), and a peer that closed would raise SIGPIPE in the worker).
int FdOf(BIO* bio) {
  return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
}

int BioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  const ssize_t n =
      send(FdOf(bio), data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(n);
}

int BioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  const ssize_t n = recv(FdOf(bio), data, static_cast<size_t>(len), 0);
  if (n == 0) BIO_set_flags(bio, BIO_FLAGS_IN_EOF);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(bio);
  }
  return static_cast<int>(n);
}

long BioCtrl(BIO* bio, int cmd, long /*num*/, void* /*ptr*/) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_EOF:
      return BIO_test_flags(bio, BIO_FLAGS_IN_EOF) != 0 ? 1 : 0;
    default:
      return 0;
  }
}

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                 "baton KV socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

// A TLS session over `fd` from `ctx`.
absl::StatusOr<UniqueSsl> NewSession(SSL_CTX* ctx, int fd) {
  ERR_clear_error();
  UniqueSsl ssl(SSL_new(ctx));
  BIO* bio = BIO_new(SocketMethod());
  if (ssl == nullptr || bio == nullptr) {
    BIO_free(bio);
    return absl::InternalError(absl::StrCat("SSL_new: ", TakeTlsErrors()));
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl.get(), bio, bio);  // one reference, owned by the session
  return ssl;
}

absl::Status FileError(absl::string_view flag, const std::string& path,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv_tls: ", flag, " '", path, "' ", what, ": ", TakeTlsErrors()));
}

absl::StatusOr<UniqueCtx> MakeContext(const KvTlsFiles& files, bool server) {
  ERR_clear_error();
  UniqueCtx ctx(
      SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("SSL_CTX_new: ", TakeTlsErrors()));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  // No session tickets: nothing arrives on an idle pooled connection, and
  // every connection authenticates with its certificate. A connection cut
  // without close_notify reads as end of stream: the KV framing tells a
  // complete transfer from a cut one.
  SSL_CTX_set_options(ctx.get(),
                      SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), files.cert.c_str()) != 1) {
    return FileError("--tls_cert", files.cert, "is not a usable certificate");
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), files.key.c_str(),
                                  SSL_FILETYPE_PEM) != 1) {
    return FileError("--tls_key", files.key, "is not a usable private key");
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return FileError("--tls_key", files.key, "is not the key of --tls_cert");
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), files.ca.c_str(), nullptr) !=
      1) {
    return FileError("--tls_ca", files.ca, "holds no usable CA certificate");
  }
  SSL_CTX_set_verify(
      ctx.get(),
      SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
      nullptr);
  return ctx;
}

std::string Stamp(const KvTlsFiles& files) {
  return FilesStamp({&files.cert, &files.key, &files.ca});
}

absl::Status Handshake(SSL* ssl, int fd, bool server, const SocketIoOptions& io,
                       absl::string_view what) {
  while (true) {
    ERR_clear_error();
    const int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
    if (rc == 1) return absl::OkStatus();
    const int err = SSL_get_error(ssl, rc);
    if (err == SSL_ERROR_WANT_READ) {
      BATON_RETURN_IF_ERROR(WaitFd(fd, POLLIN, io, what));
      continue;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
      BATON_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, io, what));
      continue;
    }
    std::string why = TakeTlsErrors();
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      why = absl::StrCat("certificate: ", X509_verify_cert_error_string(verify),
                         why.empty() ? "" : " (", why, why.empty() ? "" : ")");
    }
    if (why.empty()) {
      why = err == SSL_ERROR_SYSCALL ? "the peer closed the connection"
                                     : absl::StrCat("TLS error ", err);
    }
    return absl::UnauthenticatedError(absl::StrCat(what, " failed: ", why));
  }
}

}  // namespace

struct KvTls::Contexts {
  UniqueCtx server;
  UniqueCtx client;
};

absl::StatusOr<std::shared_ptr<KvTls>> KvTls::Create(const KvTlsFiles& files) {
  if (files.cert.empty() || files.key.empty() || files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--kv_tls needs --tls_cert, --tls_key and --tls_ca (the KV "
        "connection is mutual TLS)");
  }
  if (files.reload_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("KvTlsFiles.reload_interval must be > 0");
  }
  std::shared_ptr<KvTls> tls(new KvTls(files));
  auto contexts = std::make_shared<Contexts>();
  BATON_ASSIGN_OR_RETURN(contexts->server, MakeContext(files, true));
  BATON_ASSIGN_OR_RETURN(contexts->client, MakeContext(files, false));
  absl::MutexLock lock(&tls->mu_);
  tls->contexts_ = std::move(contexts);
  tls->stamp_ = Stamp(files);
  tls->next_look_ = absl::Now() + files.reload_interval;
  return tls;
}

KvTls::KvTls(const KvTlsFiles& files) : files_(files) {}

KvTls::~KvTls() = default;

std::shared_ptr<const KvTls::Contexts> KvTls::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now < next_look_) return contexts_;
  next_look_ = now + files_.reload_interval;
  std::string stamp = Stamp(files_);
  if (stamp == stamp_) return contexts_;
  auto contexts = std::make_shared<Contexts>();
  absl::StatusOr<UniqueCtx> server = MakeContext(files_, true);
  absl::StatusOr<UniqueCtx> client = MakeContext(files_, false);
  // A set caught half rotated (key of one pair, certificate of another)
  // fails to load: the previous one serves until the next look.
  if (server.ok() && client.ok()) {
    contexts->server = std::move(*server);
    contexts->client = std::move(*client);
    contexts_ = std::move(contexts);
    stamp_ = std::move(stamp);
  }
  return contexts_;
}

absl::StatusOr<UniqueSsl> KvTls::Accept(int fd, const SocketIoOptions& io) {
  const std::shared_ptr<const Contexts> contexts = Current();
  BATON_ASSIGN_OR_RETURN(UniqueSsl ssl, NewSession(contexts->server.get(), fd));
  BATON_RETURN_IF_ERROR(
      Handshake(ssl.get(), fd, true, io, "TLS handshake with a KV sender"));
  return ssl;
}

absl::StatusOr<UniqueSsl> KvTls::Connect(int fd, absl::string_view host,
                                         const SocketIoOptions& io) {
  const std::shared_ptr<const Contexts> contexts = Current();
  BATON_ASSIGN_OR_RETURN(UniqueSsl ssl, NewSession(contexts->client.get(), fd));
  // The receiver's certificate must name the host connected to.
  std::string name(host);
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  in6_addr addr6{};
  in_addr addr4{};
  const bool is_ip = inet_pton(AF_INET, name.c_str(), &addr4) == 1 ||
                     inet_pton(AF_INET6, name.c_str(), &addr6) == 1;
  const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(
                                SSL_get0_param(ssl.get()), name.c_str())
                          : SSL_set1_host(ssl.get(), name.c_str());
  if (named != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV receiver host '", host, "' for TLS: ", TakeTlsErrors()));
  }
  if (!is_ip) SSL_set_tlsext_host_name(ssl.get(), name.c_str());
  BATON_RETURN_IF_ERROR(
      Handshake(ssl.get(), fd, false, io,
                absl::StrCat("TLS handshake with the KV receiver at ", host)));
  return ssl;
}

}  // namespace baton
