#!/usr/bin/env python3
"""Writes a GGUF of seeded random blocks with extreme scales, for comparing
Baton's dequantization against the gguf package bit for bit.

Usage: make_extreme_blocks.py OUT.gguf

For every quantized type Baton dequantizes, two tensors:
  <TYPE>.random      random bytes everywhere, then each half-precision scale
                     replaced by an extreme value (65504, -65504, smallest
                     normal and subnormal, largest subnormal, +-0, +-inf, one
                     NaN) or by random finite half bits;
  <TYPE>.scale_grid  every pair (d, m) of those extreme values (every d alone
                     for single-scale types) over random quants.
Plus F16 and BF16 tensors holding all 65536 bit patterns, an F32 tensor of
random bits and extremes, and a 3-d Q4_1 tensor. Same seed, same file.
"""

import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20250101

# Half bit patterns that stress the widening and the float32 products.
EXTREME_F16 = np.array([
    0x7BFF,  # 65504, the largest finite half
    0xFBFF,  # -65504
    0x7BFE,  # the next one down
    0x0400,  # smallest normal, 2^-14
    0x8400,
    0x0001,  # smallest subnormal, 2^-24
    0x8001,
    0x03FF,  # largest subnormal
    0x0000,  # +0
    0x8000,  # -0
    0x7C00,  # +inf
    0xFC00,  # -inf
    0x3C00,  # 1
    0xB555,  # -0.333...
    0x7E01,  # a quiet NaN with payload
], dtype=np.uint16)

# Byte offsets of the half-precision scale fields inside one block.
SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exp_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exp_all_ones] &= 0xBFFF  # exponent 30: finite
    return bits


def set_half(blocks: np.ndarray, offset: int, bits: np.ndarray) -> None:
    blocks[:, offset] = (bits & 0xFF).astype(np.uint8)
    blocks[:, offset + 1] = (bits >> 8).astype(np.uint8)


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    # A few blocks with all quant bits clear or set.
    blocks[0, :] = 0x00
    blocks[1, :] = 0xFF
    if qtype == T.Q6_K:  # int8 scales at their extremes
        blocks[2, 192:208] = np.array([0x80, 0x7F] * 8, dtype=np.uint8)
    return blocks


def scale_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    pick = rng.integers(0, len(EXTREME_F16), size=n)
    bits = EXTREME_F16[pick]
    use_random = rng.random(n) < 0.5
    bits[use_random] = random_finite_f16(rng, int(use_random.sum()))
    return bits


def add_quantized(writer: GGUFWriter, rng: np.random.Generator, qtype: T) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    offsets = SCALE_OFFSETS[qtype]
    blocks_per_row = 4

    n_blocks = 64 * blocks_per_row
    blocks = random_blocks(rng, qtype, n_blocks)
    for off in offsets:
        set_half(blocks, off, scale_bits(rng, n_blocks))
    writer.add_tensor(f"{qtype.name}.random",
                      blocks.reshape(64, blocks_per_row * type_size), raw_dtype=qtype)

    # Every (d, m) combination of the extremes, one block each.
    k = len(EXTREME_F16)
    combos = np.array(np.meshgrid(*([np.arange(k)] * len(offsets)), indexing="ij"))
    combos = combos.reshape(len(offsets), -1)
    n_grid = combos.shape[1]
    n_rows = -(-n_grid // blocks_per_row)
    grid = random_blocks(rng, qtype, n_rows * blocks_per_row)
    for i, off in enumerate(offsets):
        bits = np.resize(EXTREME_F16[combos[i]], n_rows * blocks_per_row)
        set_half(grid, off, bits)
    writer.add_tensor(f"{qtype.name}.scale_grid",
                      grid.reshape(n_rows, blocks_per_row * type_size), raw_dtype=qtype)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT.gguf", file=sys.stderr)
        return 2
    rng = np.random.default_rng(SEED)
    writer = GGUFWriter(argv[1], arch="baton-dequant-test")

    for qtype in SCALE_OFFSETS:
        add_quantized(writer, rng, qtype)

    # 3-d tensor: shape (2, 3, 64) in numpy order.
    blocks = random_blocks(rng, T.Q4_1, 2 * 3 * 2)
    set_half(blocks, 0, scale_bits(rng, len(blocks)))
    set_half(blocks, 2, scale_bits(rng, len(blocks)))
    writer.add_tensor("Q4_1.three_d", blocks.reshape(2, 3, 2 * 20), raw_dtype=T.Q4_1)

    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    writer.add_tensor("F16.every_pattern", every_half.view(np.float16).reshape(256, 256))
    writer.add_tensor("BF16.every_pattern",
                      every_half.view(np.uint8).reshape(256, 512), raw_dtype=T.BF16)

    f32 = rng.integers(0, 1 << 32, size=16 * 64, dtype=np.uint64).astype(np.uint32)
    f32[:8] = [0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x7F800000,
               0xFF800000, 0x7FC00001, 0x80000000]
    writer.add_tensor("F32.random_bits", f32.view(np.float32).reshape(16, 64))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
