#!/usr/bin/env python3
"""Requantizes a GGUF file with llama.cpp's quantizer (llama-cpp-python), to
make K-quant models for benchmarks from `baton synth` shapes:

    build/bin/baton synth --shape=llama-3.2-1b --type=q8_0 --out=/tmp/l1b-q8.gguf
    python bench/quantize_gguf.py /tmp/l1b-q8.gguf /tmp/l1b-q4km.gguf --type Q4_K_M

--type is a llama.cpp file type (Q4_K_M, Q5_K_M, Q3_K_M, Q6_K, ...). Needs
llama-cpp-python (scripts/setup.sh --references installs it).
"""
import argparse
import ctypes
import sys

import llama_cpp as L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ftype = getattr(L, "LLAMA_FTYPE_MOSTLY_" + args.type.upper(), None)
    if ftype is None:
        sys.exit(f"quantize_gguf: unknown --type {args.type}")
    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = args.threads
    rc = L.llama_model_quantize(args.src.encode(), args.dst.encode(),
                                ctypes.byref(params))
    if rc != 0:
        sys.exit(f"quantize_gguf: llama_model_quantize returned {rc}")


if __name__ == "__main__":
    main()
