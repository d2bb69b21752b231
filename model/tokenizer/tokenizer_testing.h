// Test helpers for model/tokenizer: the shared corpus, the environment ctest
// provides, running reference scripts, and a minimal GGUF writer for small
// in-memory vocabularies.
#ifndef BATON_MODEL_TOKENIZER_TOKENIZER_TESTING_H_
#define BATON_MODEL_TOKENIZER_TOKENIZER_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::tokenizer_testing {

// The value of environment variable `name`; FailedPrecondition naming it
// (and scripts/setup.sh) if unset or empty.
absl::StatusOr<std::string> RequireEnv(const char* name);

// $BATON_SOURCE_DIR/tests/data/tokenizer/<file>.
absl::StatusOr<std::string> DataPath(absl::string_view file);

absl::StatusOr<std::string> ReadFile(const std::string& path);

// Runs `command` through /bin/sh; its stdout, or Internal with the exit
// status.
absl::StatusOr<std::string> RunCommand(const std::string& command);

struct CorpusEntry {
  std::string name;
  std::string bytes;  // exact bytes, possibly invalid UTF-8
  bool utf8;          // bytes are valid UTF-8
};
// tests/data/tokenizer/corpus.jsonl (see
// scripts/reference/tokenizer_corpus.py).
absl::StatusOr<std::vector<CorpusEntry>> LoadCorpus();

// A GGUF v3 file with metadata only (no tensors).
class GgufBuilder {
 public:
  GgufBuilder& String(absl::string_view key, absl::string_view value);
  GgufBuilder& Uint32(absl::string_view key, uint32_t value);
  GgufBuilder& Bool(absl::string_view key, bool value);
  GgufBuilder& StringArray(absl::string_view key,
                           const std::vector<std::string>& values);
  GgufBuilder& Int32Array(absl::string_view key,
                          const std::vector<int32_t>& values);
  std::vector<uint8_t> Build() const;

 private:
  void Key(absl::string_view key, uint32_t type);
  void Put(const void* p, size_t n);
  void PutString(absl::string_view s);
  std::vector<uint8_t> kv_;
  uint64_t count_ = 0;
};

}  // namespace baton::tokenizer_testing

#endif  // BATON_MODEL_TOKENIZER_TOKENIZER_TESTING_H_
