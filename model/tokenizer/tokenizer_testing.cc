#include "model/tokenizer/tokenizer_testing.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace baton::tokenizer_testing {

absl::StatusOr<std::string> RequireEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return absl::FailedPreconditionError(absl::StrCat(
        "environment variable ", name,
        " is not set: run the test through ctest (scripts/setup.sh provides "
        "the model and the venv)"));
  }
  return std::string(v);
}

absl::StatusOr<std::string> DataPath(absl::string_view file) {
  absl::StatusOr<std::string> root = RequireEnv("BATON_SOURCE_DIR");
  if (!root.ok()) return root.status();
  return absl::StrCat(*root, "/tests/data/tokenizer/", file);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> RunCommand(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("popen failed: ", command));
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(
        absl::StrCat("command failed with status ", status, ": ", command));
  }
  return out;
}

absl::StatusOr<std::vector<CorpusEntry>> LoadCorpus() {
  absl::StatusOr<std::string> path = DataPath("corpus.jsonl");
  if (!path.ok()) return path.status();
  absl::StatusOr<std::string> text = ReadFile(*path);
  if (!text.ok()) return text.status();
  std::vector<CorpusEntry> out;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("b64") ||
        !j["b64"].is_string() || !j.contains("name") ||
        !j["name"].is_string()) {
      return absl::DataLossError(absl::StrCat("bad corpus line: ", line));
    }
    CorpusEntry e;
    e.name = j["name"].get<std::string>();
    if (!absl::Base64Unescape(j["b64"].get<std::string>(), &e.bytes)) {
      return absl::DataLossError(
          absl::StrCat("bad base64 in corpus entry ", e.name));
    }
    e.utf8 = j.value("utf8", false);
    out.push_back(std::move(e));
  }
  return out;
}

void GgufBuilder::Put(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  kv_.insert(kv_.end(), b, b + n);
}

void GgufBuilder::PutString(absl::string_view s) {
  const uint64_t n = s.size();
  Put(&n, 8);
  Put(s.data(), s.size());
}

void GgufBuilder::Key(absl::string_view key, uint32_t type) {
  PutString(key);
  Put(&type, 4);
  ++count_;
}

GgufBuilder& GgufBuilder::String(absl::string_view key,
                                 absl::string_view value) {
  Key(key, 8);
  PutString(value);
  return *this;
}

GgufBuilder& GgufBuilder::Uint32(absl::string_view key, uint32_t value) {
  Key(key, 4);
  Put(&value, 4);
  return *this;
}

GgufBuilder& GgufBuilder::Bool(absl::string_view key, bool value) {
  Key(key, 7);
  const uint8_t b = value ? 1 : 0;
  Put(&b, 1);
  return *this;
}

GgufBuilder& GgufBuilder::StringArray(absl::string_view key,
                                      const std::vector<std::string>& values) {
  Key(key, 9);
  const uint32_t type = 8;
  const uint64_t n = values.size();
  Put(&type, 4);
  Put(&n, 8);
  for (const std::string& v : values) PutString(v);
  return *this;
}

GgufBuilder& GgufBuilder::Int32Array(absl::string_view key,
                                     const std::vector<int32_t>& values) {
  Key(key, 9);
  const uint32_t type = 5;
  const uint64_t n = values.size();
  Put(&type, 4);
  Put(&n, 8);
  Put(values.data(), values.size() * 4);
  return *this;
}

std::vector<uint8_t> GgufBuilder::Build() const {
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
  auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  const uint32_t version = 3;
  const uint64_t tensors = 0;
  put(&version, 4);
  put(&tensors, 8);
  put(&count_, 8);
  out.insert(out.end(), kv_.begin(), kv_.end());
  while (out.size() % 32 != 0) out.push_back(0);
  return out;
}

}  // namespace baton::tokenizer_testing
