#include "worker/transport/cuda_ipc_fake_api.h"

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

constexpr uint8_t kHandleMagic[8] = {'B', 'F', 'A', 'K', 'E', 'I', 'P', 'C'};

CudaIpcHandleBytes MakeHandle(uint64_t id) {
  CudaIpcHandleBytes h{};
  std::memcpy(h.data(), kHandleMagic, sizeof(kHandleMagic));
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<uint8_t>(id >> (8 * i));
  return h;
}

// The allocation id of a fake handle, or nullopt.
std::optional<uint64_t> HandleId(const CudaIpcHandleBytes& h) {
  if (std::memcmp(h.data(), kHandleMagic, sizeof(kHandleMagic)) != 0) {
    return std::nullopt;
  }
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= static_cast<uint64_t>(h[8 + i]) << (8 * i);
  return id;
}

// Takes the pending injected failure, if any.
absl::Status Take(absl::Status& pending) {
  return std::exchange(pending, absl::OkStatus());
}

}  // namespace

void FakeCudaIpcApi::RegisterAllocation(int device, void* base,
                                        uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = allocations_.size() + 1;
  allocations_[id] = {device, static_cast<uint8_t*>(base), bytes, false};
}

void FakeCudaIpcApi::SetStallCopies(bool stall) {
  absl::MutexLock lock(&mu_);
  stall_ = stall;
}
void FakeCudaIpcApi::FailNextCopy(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_copy_ = std::move(status);
}
void FakeCudaIpcApi::FailNextOpen(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_open_ = std::move(status);
}
void FakeCudaIpcApi::FailNextExport(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_export_ = std::move(status);
}

int FakeCudaIpcApi::num_exports() const {
  absl::MutexLock lock(&mu_);
  return exports_;
}
int FakeCudaIpcApi::num_opens() const {
  absl::MutexLock lock(&mu_);
  return opens_;
}
int FakeCudaIpcApi::num_closes() const {
  absl::MutexLock lock(&mu_);
  return closes_;
}
int FakeCudaIpcApi::num_open() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, a] : allocations_) n += a.open;
  return n;
}
int64_t FakeCudaIpcApi::num_copies() const {
  absl::MutexLock lock(&mu_);
  return copies_;
}
uint64_t FakeCudaIpcApi::bytes_copied() const {
  absl::MutexLock lock(&mu_);
  return bytes_copied_;
}
int FakeCudaIpcApi::num_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

FakeCudaIpcApi::Allocation* FakeCudaIpcApi::Find(const void* p,
                                                 uint64_t bytes) {
  const uint8_t* q = static_cast<const uint8_t*>(p);
  for (auto& [id, a] : allocations_) {
    if (q >= a.base && q <= a.base + a.bytes &&
        bytes <= static_cast<uint64_t>(a.base + a.bytes - q)) {
      return &a;
    }
  }
  return nullptr;
}

absl::StatusOr<CudaIpcExport> FakeCudaIpcApi::ExportMemory(int device,
                                                           const void* ptr) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Take(fail_export_); !s.ok()) return s;
  const uint8_t* q = static_cast<const uint8_t*>(ptr);
  for (const auto& [id, a] : allocations_) {
    if (q >= a.base && q < a.base + a.bytes) {
      if (a.device != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("fake cudaIpcGetMemHandle: memory of device ",
                         a.device, " exported on device ", device));
      }
      ++exports_;
      return CudaIpcExport{MakeHandle(id), static_cast<uint64_t>(q - a.base),
                           a.bytes};
    }
  }
  return absl::InvalidArgumentError(
      "fake cudaIpcGetMemHandle: pointer is not in a device allocation");
}

absl::StatusOr<void*> FakeCudaIpcApi::OpenMemory(
    int, const CudaIpcHandleBytes& handle) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Take(fail_open_); !s.ok()) return s;
  const std::optional<uint64_t> id = HandleId(handle);
  auto it = id.has_value() ? allocations_.find(*id) : allocations_.end();
  if (it == allocations_.end()) {
    return absl::InvalidArgumentError(
        "fake cudaIpcOpenMemHandle: unknown handle");
  }
  if (it->second.open) {
    return absl::AlreadyExistsError(
        "fake cudaIpcOpenMemHandle: handle is already open in this process");
  }
  it->second.open = true;
  ++opens_;
  return static_cast<void*>(it->second.base);
}

void FakeCudaIpcApi::CloseMemory(int, void* base) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, a] : allocations_) {
    if (a.base == base && a.open) {
      a.open = false;
      ++closes_;
      return;
    }
  }
}

absl::StatusOr<CudaIpcStreamHandle> FakeCudaIpcApi::StreamCreate(int) {
  absl::MutexLock lock(&mu_);
  auto stream = std::make_unique<Stream>();
  Stream* raw = stream.get();
  streams_[raw] = std::move(stream);
  return static_cast<CudaIpcStreamHandle>(raw);
}

void FakeCudaIpcApi::StreamDestroy(int, CudaIpcStreamHandle stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(static_cast<Stream*>(stream));
}

absl::Status FakeCudaIpcApi::CopyBatchAsync(int, std::span<const Copy> copies,
                                            CudaIpcStreamHandle stream) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Take(fail_copy_); !s.ok()) return s;
  auto it = streams_.find(static_cast<Stream*>(stream));
  if (it == streams_.end()) {
    return absl::InvalidArgumentError("fake cudaMemcpyBatchAsync: bad stream");
  }
  for (const Copy& c : copies) it->second->queue.push_back(c);
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeCudaIpcApi::StreamDone(CudaIpcStreamHandle stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(static_cast<Stream*>(stream));
  if (it == streams_.end()) {
    return absl::InvalidArgumentError("fake cudaStreamQuery: bad stream");
  }
  Stream& s = *it->second;
  while (!stall_ && s.error.ok() && !s.queue.empty()) {
    const Copy c = s.queue.front();
    s.queue.pop_front();
    if (Find(c.dst, c.bytes) == nullptr) {
      s.error = absl::InternalError(
          "fake copy: destination outside every device allocation");
      break;
    }
    std::memmove(c.dst, c.src, c.bytes);
    ++copies_;
    bytes_copied_ += c.bytes;
  }
  if (!s.error.ok()) return s.error;
  return s.queue.empty();
}

}  // namespace baton
