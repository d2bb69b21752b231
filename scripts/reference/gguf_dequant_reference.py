#!/usr/bin/env python3
"""Dequantizes every tensor of a GGUF file with the `gguf` package.

Usage: gguf_dequant_reference.py MODEL.gguf > values.bin

Writes to stdout, for every tensor in file order:
  [u32 name length][name bytes (UTF-8)][u64 element count][float32 values]
all little-endian. Values are in the tensor's row-major order (innermost GGUF
dimension fastest). One tensor is held in memory at a time.
"""

import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} MODEL.gguf", file=sys.stderr)
        return 2
    reader = GGUFReader(argv[1])
    out = sys.stdout.buffer
    for tensor in reader.tensors:
        # inf and NaN scales are part of the test data; their warnings are noise.
        with np.errstate(all="ignore"):
            values = dequantize(tensor.data, tensor.tensor_type)
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        if values.size != int(tensor.n_elements):
            print(f"{tensor.name}: {values.size} values, expected "
                  f"{int(tensor.n_elements)}", file=sys.stderr)
            return 1
        name = tensor.name.encode("utf-8")
        out.write(len(name).to_bytes(4, "little"))
        out.write(name)
        out.write(values.size.to_bytes(8, "little"))
        out.write(memoryview(values).cast("B"))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
