// Throw-away certificate authorities for tests of TLS: an EC P-256 CA made
// at run time with OpenSSL, and leaf certificates it signs for
// 127.0.0.1 / ::1 / localhost, usable by servers and clients alike. Nothing
// is ever written outside the directory a test names.
#ifndef BATON_COMMON_TESTING_TEST_PKI_H_
#define BATON_COMMON_TESTING_TEST_PKI_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton::testing {

struct PemPair {
  std::string cert;  // PEM certificate
  std::string key;   // PEM (PKCS#8) private key
};

class TestCa {
 public:
  // A self-signed CA named `name`, valid from an hour ago for ten days.
  static absl::StatusOr<std::unique_ptr<TestCa>> Create(
      const std::string& name);
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  // A leaf certificate for `common_name` with subjectAltNames 127.0.0.1,
  // ::1 and localhost, for server and client authentication, valid from
  // now + not_before to now + not_after (both may be negative: an expired
  // certificate).
  absl::StatusOr<PemPair> Issue(
      const std::string& common_name,
      absl::Duration not_before = absl::Hours(-1),
      absl::Duration not_after = absl::Hours(24 * 10)) const;
  const std::string& cert_pem() const { return ca_.cert; }

 private:
  struct Keys;
  TestCa();
  std::unique_ptr<Keys> keys_;
  PemPair ca_;
};

// A fresh directory "$TMPDIR/PREFIX.XXXXXX" (/tmp without TMPDIR), removed
// with everything in it when its owner goes. A default-constructed TempDir
// owns nothing.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create(const std::string& prefix);
  TempDir() = default;
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const;

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  void Remove();
  std::string path_;
};

// Writes `contents` to `path` by writing a sibling file and renaming it
// over `path` (a reader never sees half a file).
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

}  // namespace baton::testing

#endif  // BATON_COMMON_TESTING_TEST_PKI_H_
