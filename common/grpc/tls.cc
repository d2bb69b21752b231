#include "common/grpc/tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

namespace gx = grpc::experimental;

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

absl::StatusOr<std::string> ReadWhole(const std::string& path,
                                      const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(const std::string& path,
                                                      const std::string& flag) {
  auto pem = ReadWhole(path, flag);
  if (!pem.ok()) return pem.status();
  auto bio = MemoryBio(*pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM certificate"));
  }
  return certs;
}

absl::Status CheckValidNow(X509* cert, const std::string& path,
                           const std::string& flag) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the certificate in '", path, "' has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": the certificate in '", path, "' is not valid yet"));
  }
  return absl::OkStatus();
}

unsigned IntervalSeconds(absl::Duration interval) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
}

std::shared_ptr<gx::FileWatcherCertificateProvider> Provider(
    const TlsFiles& files) {
  const unsigned interval = IntervalSeconds(files.reload_interval);
  if (files.cert.empty()) {
    return std::make_shared<gx::FileWatcherCertificateProvider>(files.ca,
                                                                interval);
  }
  return std::make_shared<gx::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, interval);
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files, bool server,
                           const std::string& flag_prefix) {
  if (!files.enabled()) return absl::OkStatus();
  const std::string cert_flag = flag_prefix + "_cert";
  const std::string key_flag = flag_prefix + "_key";
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_flag, " and ", key_flag, " go together (one is empty)"));
  }
  if (server && files.cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a TLS server needs ", cert_flag, " and ", key_flag));
  }
  if (!server && files.ca.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a TLS client needs the CA that signed its peers' certificates (",
        flag_prefix, "_ca)"));
  }
  if (!files.cert.empty()) {
    auto chain = ReadCertificates(files.cert, cert_flag);
    if (!chain.ok()) return chain.status();
    if (absl::Status s =
            CheckValidNow(chain->front().get(), files.cert, cert_flag);
        !s.ok()) {
      return s;
    }
    auto pem = ReadWhole(files.key, key_flag);
    if (!pem.ok()) return pem.status();
    auto bio = MemoryBio(*pem);
    std::unique_ptr<EVP_PKEY, KeyFree> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    ERR_clear_error();
    if (key == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_flag, ": '", files.key,
                       "' holds no unencrypted PEM private key"));
    }
    if (X509_check_private_key(chain->front().get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          key_flag, ": '", files.key,
          "' is not the private key of the certificate in '", files.cert, "'"));
    }
  }
  if (!files.ca.empty()) {
    auto roots = ReadCertificates(files.ca, flag_prefix + "_ca");
    if (!roots.ok()) return roots.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status s = CheckTlsFiles(files, /*server=*/true, flag_prefix);
      !s.ok()) {
    return s;
  }
  gx::TlsServerCredentialsOptions options(Provider(files));
  options.watch_identity_key_cert_pairs();
  if (files.ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return gx::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  if (absl::Status s = CheckTlsFiles(files, /*server=*/false, flag_prefix);
      !s.ok()) {
    return s;
  }
  gx::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(files));
  options.watch_root_certs();
  if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<gx::HostNameCertificateVerifier>());
  return gx::TlsCredentials(options);
}

bool IsLoopbackHost(const std::string& host_in) {
  std::string host = absl::AsciiStrToLower(host_in);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace baton
