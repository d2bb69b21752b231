// The AVX-512 MatMul kernels for CPUs without VNNI (matmul_avx512_impl.h).
#define BATON_AVX512_VNNI 0
#define BATON_AVX512_KERNELS Avx512Kernels
#include "kernels/cpu/matmul_avx512_impl.h"
