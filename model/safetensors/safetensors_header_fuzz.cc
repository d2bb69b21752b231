// Feeds arbitrary bytes to the safetensors parser: it must return a status,
// never crash, and every tensor it accepts must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/check.h"
#include "model/safetensors/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file =
      baton::SafetensorsFile::Parse(std::span<const uint8_t>(data, size));
  if (!file.ok()) return 0;
  for (const baton::SafetensorsTensorInfo& info : (*file)->tensors()) {
    BATON_CHECK_LE(info.offset, size);
    BATON_CHECK_LE(info.nbytes, size - info.offset);
    BATON_CHECK((*file)->FindTensor(info.name) == &info);
    auto view = (*file)->View(info);
    if (view.ok()) {
      BATON_CHECK_EQ(view->nbytes, info.nbytes);
      BATON_CHECK_EQ(static_cast<uint64_t>(view->NumElements()) *
                         static_cast<uint64_t>(
                             baton::GetDTypeInfo(view->dtype).block_bytes),
                     view->nbytes);
      // Touch the first and last byte so ASan sees any out-of-range view.
      if (view->nbytes > 0) {
        volatile uint8_t sink = view->data[0] ^ view->data[view->nbytes - 1];
        (void)sink;
      }
    }
  }
  return 0;
}
