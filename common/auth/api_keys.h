// API keys for the public plane: a file with one key per line (blank lines
// and lines starting with '#' are skipped), re-read when it changes, and the
// check of an "Authorization: Bearer KEY" value against it. Only SHA-256
// digests of the keys are held; a key is never logged or echoed back.
#ifndef BATON_COMMON_AUTH_API_KEYS_H_
#define BATON_COMMON_AUTH_API_KEYS_H_

#include <sys/types.h>

#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

class ApiKeys {
 public:
  // Reads `path` now: NotFound / InvalidArgument (naming --api_keys_file)
  // if it cannot be read or holds no key. Afterwards the file is looked at
  // (stat) at most once per `reload_interval` when a key is checked, and
  // re-read when its modification time, size or inode changed; a re-read
  // that fails or finds no key keeps the previous keys (and says so on
  // stderr).
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(
      const std::string& path,
      absl::Duration reload_interval = absl::Seconds(1));
  ApiKeys(const ApiKeys&) = delete;
  ApiKeys& operator=(const ApiKeys&) = delete;

  // OK if `authorization` is "Bearer KEY" (scheme case-insensitive) with a
  // key of the file or the process key; Unauthenticated otherwise, with a
  // message that never contains what was sent.
  absl::Status Check(absl::string_view authorization);

  // A random key (32 bytes, hex) that Check accepts for this process's
  // life, whatever the file says: how the coordinator's own HTTP gateway
  // calls its gRPC API. Never written anywhere.
  const std::string& process_key() const { return process_key_; }

  // Keys read from the file now.
  size_t size();

 private:
  struct FileId {
    ino_t inode = 0;
    off_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  ApiKeys(std::string path, absl::Duration reload_interval);
  // Re-reads the file if it changed and reload_interval has passed.
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The digests of the file's keys; InvalidArgument if it has none.
  static absl::StatusOr<std::set<std::string>> ReadDigests(
      const std::string& path);

  const std::string path_;
  const absl::Duration reload_interval_;
  const std::string process_key_;
  const std::string process_digest_;
  absl::Mutex mu_;
  std::set<std::string> digests_ ABSL_GUARDED_BY(mu_);
  FileId file_ ABSL_GUARDED_BY(mu_);
  absl::Time next_look_ ABSL_GUARDED_BY(mu_);
};

// "Bearer KEY" for a key: the value of an authorization header.
std::string BearerValue(absl::string_view key);

}  // namespace baton

#endif  // BATON_COMMON_AUTH_API_KEYS_H_
