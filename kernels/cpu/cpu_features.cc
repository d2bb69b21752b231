#include "kernels/cpu/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace baton {
namespace {

#if defined(__x86_64__)
uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;  // SSE + AVX state
  const bool zmm_state =
      (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state) return f;
  const bool avx = (c >> 28) & 1;
  f.fma = avx && ((c >> 12) & 1);
  f.f16c = avx && ((c >> 29) & 1);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = avx && ((b >> 5) & 1);
  if (zmm_state) {
    f.avx512f = (b >> 16) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
  }
  unsigned a1, b1, c1, d1;
  if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
    f.avx_vnni = avx && ((a1 >> 4) & 1);
  }
  return f;
}
#else
CpuFeatures Detect() { return CpuFeatures(); }
#endif

CpuIsa DetectBestIsa() {
  CpuIsa best = CpuIsa::kScalar;
  for (CpuIsa isa : kAllCpuIsas) {
    if (IsCpuIsaSupported(isa)) best = isa;
  }
  if (const char* env = std::getenv("BATON_CPU_ISA"); env != nullptr) {
    absl::StatusOr<CpuIsa> cap = ParseCpuIsa(env);
    if (cap.ok() && static_cast<int>(*cap) < static_cast<int>(best)) {
      best = *cap;
    }
  }
  return best;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

bool IsCpuIsaSupported(CpuIsa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case CpuIsa::kAvx512:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl;
    case CpuIsa::kAvx512Vnni:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw &&
             f.avx512vl && f.avx512vnni;
  }
  return false;
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = DetectBestIsa();
  return best;
}

absl::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "unknown";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name) {
  for (CpuIsa isa : kAllCpuIsas) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU ISA \"", name,
                   "\"; expected scalar, avx2, avx512 or avx512vnni"));
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(' ', colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown CPU";
}

}  // namespace baton
