// One anonymous, zero-filled, huge-page-aligned allocation backing a KV pool.
#ifndef BATON_WORKER_KV_CACHE_KV_POOL_MEMORY_H_
#define BATON_WORKER_KV_CACHE_KV_POOL_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace baton {

class KvPoolMemory {
 public:
  // Alignment of data(): 2 MiB, so transparent huge pages can back the pool.
  static constexpr uint64_t kAlignment = uint64_t{2} << 20;

  // `bytes` > 0. The memory reads as zeros; it is committed on first touch,
  // or at once when `prefault`. ResourceExhausted naming `bytes` if the
  // mapping fails.
  static absl::StatusOr<std::unique_ptr<KvPoolMemory>> Allocate(
      uint64_t bytes, bool prefault = false);

  KvPoolMemory(const KvPoolMemory&) = delete;
  KvPoolMemory& operator=(const KvPoolMemory&) = delete;
  ~KvPoolMemory();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  KvPoolMemory(void* mapping, uint64_t mapping_bytes, uint8_t* data,
               uint64_t size)
      : mapping_(mapping),
        mapping_bytes_(mapping_bytes),
        data_(data),
        size_(size) {}

  void* mapping_;
  uint64_t mapping_bytes_;
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace baton

#endif  // BATON_WORKER_KV_CACHE_KV_POOL_MEMORY_H_
