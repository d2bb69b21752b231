"""Writes safetensors reference files with the official `safetensors` package.

Usage: testdata_writer.py OUT_DIR

OUT_DIR/reference.safetensors holds three seeded tensors:
  weight_f32  F32  [4, 5]
  weight_f16  F16  [3, 7]     (includes 0, -0, +-inf, NaN, a subnormal, 65504)
  weight_bf16 BF16 [2, 3, 4]  (includes 0, -0, +-inf, NaN)
with __metadata__ {"format": "np", "writer": "baton-test"}. For each tensor
NAME, OUT_DIR/NAME.f32 holds its exact values as raw little-endian float32.

OUT_DIR/sharded/ holds a two-shard model: model-00001-of-00002.safetensors
(layer.0.weight F32 [2, 3], layer.0.bias F16 [3]),
model-00002-of-00002.safetensors (layer.1.weight BF16 [3, 2]) and
model.safetensors.index.json; each tensor's values are in
OUT_DIR/sharded/NAME.f32 as above.
"""

import json
import os
import sys

import numpy as np
from safetensors._safetensors_rust import TensorSpec, serialize_file
from safetensors.numpy import save_file


def bf16_bits(values):
    """float32 array -> uint16 bfloat16 bits, round to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    nan = np.isnan(values)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x40)
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def save_with_bf16(path, arrays, bf16, metadata):
    """Writes numpy `arrays` plus `bf16` (name -> uint16 bits) to `path`."""
    keep = []
    specs = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        keep.append(a)
        specs[name] = TensorSpec(dtype=a.dtype.name, shape=a.shape,
                                 data_ptr=a.ctypes.data, data_len=a.nbytes)
    for name, b in bf16.items():
        b = np.ascontiguousarray(b, dtype="<u2")
        keep.append(b)
        specs[name] = TensorSpec(dtype="bfloat16", shape=b.shape,
                                 data_ptr=b.ctypes.data, data_len=b.nbytes)
    serialize_file(specs, path, metadata=metadata)


def write_raw(path, values):
    np.ascontiguousarray(values, dtype="<f4").tofile(path)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20240611)

    f32 = rng.standard_normal((4, 5)).astype(np.float32)
    f16_src = rng.standard_normal(21).astype(np.float32) * 100
    f16_src[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-7, 65504.0]
    f16 = f16_src.astype(np.float16).reshape(3, 7)
    bf16_src = rng.standard_normal(24).astype(np.float32) * 1e3
    bf16_src[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    bf16 = bf16_bits(bf16_src).reshape(2, 3, 4)

    save_with_bf16(os.path.join(out, "reference.safetensors"),
                   {"weight_f32": f32, "weight_f16": f16},
                   {"weight_bf16": bf16},
                   {"format": "np", "writer": "baton-test"})
    write_raw(os.path.join(out, "weight_f32.f32"), f32)
    write_raw(os.path.join(out, "weight_f16.f32"), f16.astype(np.float32))
    write_raw(os.path.join(out, "weight_bf16.f32"), bf16_to_f32(bf16))

    sharded = os.path.join(out, "sharded")
    os.makedirs(sharded, exist_ok=True)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float16)
    w1 = bf16_bits(rng.standard_normal(6).astype(np.float32)).reshape(3, 2)
    shard1 = "model-00001-of-00002.safetensors"
    shard2 = "model-00002-of-00002.safetensors"
    save_file({"layer.0.weight": w0, "layer.0.bias": b0},
              os.path.join(sharded, shard1), metadata={"format": "np"})
    save_with_bf16(os.path.join(sharded, shard2), {}, {"layer.1.weight": w1},
                   {"format": "np"})
    index = {
        "metadata": {"total_size": int(w0.nbytes + b0.nbytes + w1.nbytes)},
        "weight_map": {"layer.0.weight": shard1, "layer.0.bias": shard1,
                       "layer.1.weight": shard2},
    }
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    write_raw(os.path.join(sharded, "layer.0.weight.f32"), w0)
    write_raw(os.path.join(sharded, "layer.0.bias.f32"), b0.astype(np.float32))
    write_raw(os.path.join(sharded, "layer.1.weight.f32"), bf16_to_f32(w1))


if __name__ == "__main__":
    main()
