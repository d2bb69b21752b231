#!/usr/bin/env python3
"""Writes small valid inputs for each fuzz target, as starting corpora.

    python tests/fuzz/make_seeds.py OUT_DIR

OUT_DIR/gguf: a tiny GGUF written by the `gguf` package (every metadata
type, two tensors); OUT_DIR/safetensors: a tiny file written by the
`safetensors` package; OUT_DIR/tokenizer: the strings of the tokenizer corpus.
"""
import base64
import json
import os
import sys

import numpy as np


def gguf_seed(path):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("flag", True)
    w.add_string("name", "seed")
    w.add_array("tokens", ["a", "b", "<|im_end|>"])
    w.add_array("scores", [0.5, -1.0])
    w.add_tensor("w", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("h", np.ones((1, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def safetensors_seed(path):
    from safetensors.numpy import save_file
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
               "b": np.ones((4,), dtype=np.float16)}, path,
              metadata={"format": "np"})


def tokenizer_seeds(directory, corpus):
    """One seed per string of the tokenizer corpus (JSON lines, base64)."""
    with open(corpus) as f:
        for i, line in enumerate(f):
            entry = json.loads(line)
            with open(os.path.join(directory, f"corpus{i:03d}"), "wb") as out:
                out.write(base64.b64decode(entry["b64"]))


def main():
    out = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("gguf", "safetensors", "tokenizer"):
        os.makedirs(os.path.join(out, name), exist_ok=True)
    gguf_seed(os.path.join(out, "gguf", "seed.gguf"))
    safetensors_seed(os.path.join(out, "safetensors", "seed.safetensors"))
    with open(os.path.join(out, "tokenizer", "seed_chat"), "w") as f:
        f.write("<|im_start|>user\nHello, world! 12345 héllo 日本語 🙂<|im_end|>\n")
    tokenizer_seeds(os.path.join(out, "tokenizer"),
                    os.path.join(root, "tests", "data", "tokenizer", "corpus.jsonl"))
    json.dump({"ok": True}, sys.stdout)


if __name__ == "__main__":
    main()
