#include "common/auth/api_keys.h"

#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {
namespace {

std::string Digest(absl::string_view key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(),
         digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string RandomKey() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fprintf(stderr, "RAND_bytes failed: no entropy for the process key\n");
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace

std::string BearerValue(absl::string_view key) {
  return absl::StrCat("Bearer ", key);
}

ApiKeys::ApiKeys(std::string path, absl::Duration reload_interval)
    : path_(std::move(path)),
      reload_interval_(reload_interval),
      process_key_(RandomKey()),
      process_digest_(Digest(process_key_)) {}

absl::StatusOr<std::set<std::string>> ApiKeys::ReadDigests(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--api_keys_file: cannot read '", path, "'"));
  }
  std::set<std::string> digests;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (key.empty() || key.front() == '#') continue;
    digests.insert(Digest(key));
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api_keys_file: '", path,
                     "' holds no key (one per line; '#' starts a comment)"));
  }
  return digests;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(
    const std::string& path, absl::Duration reload_interval) {
  std::unique_ptr<ApiKeys> keys(new ApiKeys(path, reload_interval));
  absl::MutexLock lock(&keys->mu_);
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    keys->file_ =
        FileId{st.st_ino, st.st_size,
               int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
  }
  auto digests = ReadDigests(path);
  if (!digests.ok()) return digests.status();
  keys->digests_ = std::move(*digests);
  keys->next_look_ = absl::Now() + reload_interval;
  return keys;
}

void ApiKeys::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now < next_look_) return;
  next_look_ = now + reload_interval_;
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return;  // mid-rename: next time
  const FileId id{st.st_ino, st.st_size,
                  int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
  if (id == file_) return;
  auto digests = ReadDigests(path_);
  if (!digests.ok()) {
    std::fprintf(stderr, "api keys: keeping the previous keys: %s\n",
                 std::string(digests.status().message()).c_str());
    return;
  }
  file_ = id;
  digests_ = std::move(*digests);
}

absl::Status ApiKeys::Check(absl::string_view authorization) {
  absl::string_view value = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError(
        "missing API key: send the header 'Authorization: Bearer <key>'");
  }
  const std::string digest =
      Digest(absl::StripAsciiWhitespace(value.substr(kScheme.size())));
  if (digest == process_digest_) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  MaybeReload();
  if (digests_.count(digest) > 0) return absl::OkStatus();
  return absl::UnauthenticatedError("API key not recognised");
}

size_t ApiKeys::size() {
  absl::MutexLock lock(&mu_);
  return digests_.size();
}

}  // namespace baton
