#include "worker/kv_cache/kv_pool_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<std::unique_ptr<KvPoolMemory>> KvPoolMemory::Allocate(
    uint64_t bytes, bool prefault) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("KV pool size must be positive");
  }
  // Round up to whole huge pages and over-map by one so the start can be
  // aligned; the slack stays mapped (address space only, never touched).
  uint64_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (size < bytes || size + kAlignment < size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool of ", bytes, " bytes exceeds the address space"));
  }
  uint64_t mapping_bytes = size + kAlignment;
  void* mapping = mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the KV pool: ", bytes, " bytes (",
                     std::strerror(err), ")"));
  }
  uintptr_t addr = reinterpret_cast<uintptr_t>(mapping);
  uintptr_t aligned = (addr + kAlignment - 1) / kAlignment * kAlignment;
  uint8_t* data = reinterpret_cast<uint8_t*>(aligned);
#ifdef MADV_HUGEPAGE
  // Advisory only: without transparent huge pages the pool still works.
  (void)madvise(data, size, MADV_HUGEPAGE);
#endif
  if (prefault) std::memset(data, 0, bytes);
  return std::unique_ptr<KvPoolMemory>(
      new KvPoolMemory(mapping, mapping_bytes, data, bytes));
}

KvPoolMemory::~KvPoolMemory() { munmap(mapping_, mapping_bytes_); }

}  // namespace baton
