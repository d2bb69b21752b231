#include "common/testing/test_pki.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton::testing {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
template <typename T>
using Ptr = std::unique_ptr<T, Free>;

absl::Status OpenSslError(const std::string& what) {
  const unsigned long code = ERR_get_error();
  char text[256] = {0};
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

std::string BioString(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr,
                               nullptr) != 1) {
    return OpenSslError("PEM_write_bio_PrivateKey");
  }
  return BioString(bio.get());
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1) {
    return OpenSslError("PEM_write_bio_X509");
  }
  return BioString(bio.get());
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid,
                          const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Ptr<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError(absl::StrCat("extension ", value));
  }
  return absl::OkStatus();
}

// A certificate for `key` named `common_name`, without its signature.
absl::StatusOr<Ptr<X509>> NewCertificate(EVP_PKEY* key,
                                         const std::string& common_name,
                                         absl::Duration not_before,
                                         absl::Duration not_after) {
  Ptr<X509> cert(X509_new());
  unsigned char serial[16];
  if (cert == nullptr || RAND_bytes(serial, sizeof(serial)) != 1) {
    return OpenSslError("X509_new");
  }
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_set_version(cert.get(), 2);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()),
                  absl::ToInt64Seconds(not_before));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                  absl::ToInt64Seconds(not_after));
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(
      name, "CN", MBSTRING_UTF8,
      reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  if (X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("X509_set_pubkey");
  }
  return cert;
}

absl::StatusOr<Ptr<EVP_PKEY>> NewKey() {
  Ptr<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("EVP_EC_gen");
  return key;
}

}  // namespace

struct TestCa::Keys {
  Ptr<EVP_PKEY> key;
  Ptr<X509> cert;
};

TestCa::TestCa() : keys_(std::make_unique<Keys>()) {}
TestCa::~TestCa() = default;

absl::StatusOr<std::unique_ptr<TestCa>> TestCa::Create(
    const std::string& name) {
  std::unique_ptr<TestCa> ca(new TestCa());
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert =
      NewCertificate(key->get(), name, absl::Hours(-1), absl::Hours(24 * 10));
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509_set_issuer_name(c, X509_get_subject_name(c));
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
        std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
        std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(c, c, nid, value); !s.ok()) return s;
  }
  if (X509_sign(c, key->get(), EVP_sha256()) == 0) {
    return OpenSslError("X509_sign");
  }
  auto cert_pem = CertPem(c);
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = KeyPem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  ca->ca_ = PemPair{*cert_pem, *key_pem};
  ca->keys_->key = std::move(*key);
  ca->keys_->cert = std::move(*cert);
  return ca;
}

absl::StatusOr<PemPair> TestCa::Issue(const std::string& common_name,
                                      absl::Duration not_before,
                                      absl::Duration not_after) const {
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = NewCertificate(key->get(), common_name, not_before, not_after);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509* issuer = keys_->cert.get();
  X509_set_issuer_name(c, X509_get_subject_name(issuer));
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:FALSE"},
        std::pair{NID_key_usage, "critical,digitalSignature,keyEncipherment"},
        std::pair{NID_ext_key_usage, "serverAuth,clientAuth"},
        std::pair{NID_subject_alt_name, "IP:127.0.0.1,IP:::1,DNS:localhost"},
        std::pair{NID_authority_key_identifier, "keyid:always"}}) {
    if (absl::Status s = AddExtension(c, issuer, nid, value); !s.ok()) {
      return s;
    }
  }
  if (X509_sign(c, keys_->key.get(), EVP_sha256()) == 0) {
    return OpenSslError("X509_sign");
  }
  auto cert_pem = CertPem(c);
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = KeyPem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  return PemPair{*cert_pem, *key_pem};
}

absl::StatusOr<TempDir> TempDir::Create(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/", prefix, ".XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("mkdtemp ", path, " failed: ", strerror(errno)));
  }
  return TempDir(std::move(path));
}

TempDir::TempDir(TempDir&& other) noexcept
    : path_(std::exchange(other.path_, std::string())) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, std::string());
  }
  return *this;
}

TempDir::~TempDir() { Remove(); }

void TempDir::Remove() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
  path_.clear();
}

std::string TempDir::File(const std::string& name) const {
  return absl::StrCat(path_, "/", name);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string temp = path + ".new";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << contents;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", temp));
  }
  return absl::OkStatus();
}

}  // namespace baton::testing
