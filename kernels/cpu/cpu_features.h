// Run-time detection of the x86-64 SIMD extensions the CPU kernels use, and
// the instruction-set paths ("ISAs") those kernels offer.
#ifndef BATON_KERNELS_CPU_CPU_FEATURES_H_
#define BATON_KERNELS_CPU_CPU_FEATURES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// What CPUID and XGETBV report (the OS must also save the vector state for a
// feature to count as present). All false on a non-x86-64 build.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx_vnni = false;
};

// Detected once, then cached. Thread-safe.
const CpuFeatures& GetCpuFeatures();

// Kernel paths, slowest to fastest. Every path computes each result with the
// same operations in the same order, so all give the same bits (the kernels'
// tests and ModelRunnerTest.LogitsBitIdenticalAcrossIsaPaths check it); only
// speed differs.
enum class CpuIsa {
  kScalar = 0,      // portable C++, any x86-64 (or other) CPU
  kAvx2 = 1,        // AVX2 + FMA + F16C
  kAvx512 = 2,      // AVX-512 F/BW/VL + FMA + F16C, no VNNI (Skylake-X class)
  kAvx512Vnni = 3,  // AVX-512 F/BW/VL/VNNI + FMA + F16C
};

// Every path, slowest first.
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2,
                                         CpuIsa::kAvx512, CpuIsa::kAvx512Vnni};

bool IsCpuIsaSupported(CpuIsa isa);
// The fastest supported path; cached.
// BATON_CPU_ISA=scalar|avx2|avx512|avx512vnni in the environment lowers it
// (never raises it past what the CPU supports), so machines with different CPUs
// can be made to agree bit-for-bit.
CpuIsa BestCpuIsa();
// "scalar", "avx2", "avx512", "avx512vnni".
absl::string_view CpuIsaName(CpuIsa isa);
// Inverse of CpuIsaName; InvalidArgument for any other string.
absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name);

// The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC 7551 ..."), or
// "unknown CPU": printed next to every benchmark figure.
std::string CpuModelName();

}  // namespace baton

#endif  // BATON_KERNELS_CPU_CPU_FEATURES_H_
