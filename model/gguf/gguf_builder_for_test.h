// Builds GGUF bytes in memory, field by field, so tests and fuzz seeds can
// make well-formed files and then break exactly one thing.
#ifndef BATON_MODEL_GGUF_GGUF_BUILDER_FOR_TEST_H_
#define BATON_MODEL_GGUF_GGUF_BUILDER_FOR_TEST_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace baton::testing {

class GgufBuilder {
 public:
  std::vector<uint8_t>& bytes() { return bytes_; }

  template <typename T>
  GgufBuilder& Put(T v) {
    size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  GgufBuilder& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  GgufBuilder& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return Put<uint32_t>(0x46554747)
        .Put<uint32_t>(version)
        .Put(n_tensors)
        .Put(n_kv);
  }
  // A key and a value type; the caller then Put()s the value.
  GgufBuilder& Key(const std::string& key, uint32_t type) {
    return Str(key).Put<uint32_t>(type);
  }
  // A tensor info with GGUF-order dims (innermost first).
  GgufBuilder& TensorInfo(const std::string& name,
                          const std::vector<uint64_t>& ne, uint32_t type,
                          uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Put(d);
    return Put(type).Put(offset);
  }
  GgufBuilder& PadTo(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  GgufBuilder& Fill(size_t n, uint8_t value) {
    bytes_.insert(bytes_.end(), n, value);
    return *this;
  }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace baton::testing

#endif  // BATON_MODEL_GGUF_GGUF_BUILDER_FOR_TEST_H_
