// The AVX-512 VNNI MatMul kernels (matmul_avx512_impl.h).
#define BATON_AVX512_VNNI 1
#define BATON_AVX512_KERNELS Avx512VnniKernels
#include "kernels/cpu/matmul_avx512_impl.h"
