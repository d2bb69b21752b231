// libFuzzer target: arbitrary bytes through the GGUF parser. A parsed file's
// every metadata value, array element and tensor view is touched, so an
// accepted-but-inconsistent file also shows up under ASan.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/gguf/gguf_file.h"

namespace {

void Touch(const baton::GgufValue& v, size_t& sink) {
  sink += v.DebugString().size();
  if (v.type() == baton::GgufType::kArray) {
    const auto& a = std::get<baton::GgufArray>(v.value);
    for (size_t i = 0; i < a.size() && i < 256; ++i) Touch(a.Get(i), sink);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = baton::GgufFile::Parse(std::span<const uint8_t>(data, size));
  if (!file.ok()) return 0;
  size_t sink = 0;
  for (const auto& [key, value] : (*file)->metadata()) Touch(value, sink);
  for (const auto& info : (*file)->tensors()) {
    baton::TensorView view = (*file)->View(info);
    if (view.nbytes > 0) {
      sink += view.data[0] + view.data[view.nbytes - 1];
    }
  }
  return sink == 0xdeadbeef ? 1 : 0;
}
