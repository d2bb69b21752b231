// Code and scale extraction of GGUF blocks, shared by the dequantization
// (dequantize.cc) and the load-time repacking (repack.cc) so both read a
// block the same way. Internal to kernels/cpu.
#ifndef BATON_KERNELS_CPU_QUANT_BLOCKS_H_
#define BATON_KERNELS_CPU_QUANT_BLOCKS_H_

#include <cstdint>

namespace baton::quant_blocks {

// The f16 at p (any alignment), widened.
float F16At(const uint8_t* p);
// The eight 6-bit scales and mins of a Q4_K / Q5_K block's 12 scale bytes.
void ScalesAndMins(const uint8_t* s, int sc[8], int mn[8]);
// Codes in element order: Q5_0's q - 16 (32), Q5_1's q (0..31, 32),
// Q3_K's q (-4..3, 256) with its sixteen scales sc - 32, Q5_K's q (0..31,
// 256), Q6_K's q - 32 (256).
void Q5_0Codes(const uint8_t* b, int8_t* q);
void Q5_1Codes(const uint8_t* b, int8_t* q);
void Q3_KCodes(const uint8_t* b, int8_t* q, int* sc);
void Q5_KCodes(const uint8_t* b, int8_t* q);
void Q6_KCodes(const uint8_t* b, int8_t* q);

}  // namespace baton::quant_blocks

#endif  // BATON_KERNELS_CPU_QUANT_BLOCKS_H_
