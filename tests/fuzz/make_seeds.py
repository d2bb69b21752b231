#!/usr/bin/env python3
"""Writes small valid inputs for each fuzz target, as starting corpora.

    python tests/fuzz/make_seeds.py OUT_DIR

OUT_DIR/gguf: a tiny GGUF written by the `gguf` package (every metadata
type, two tensors); OUT_DIR/safetensors: a tiny file written by the
`safetensors` package; OUT_DIR/tokenizer: the strings of the tokenizer corpus;
OUT_DIR/tokenizer_json: a small byte-level BPE tokenizer.json written by the
`tokenizers` package (and a tokenizer_config.json after a NUL byte);
OUT_DIR/kv_wire: KV frames laid out as worker/transport/kv_wire.h and
cuda_ipc_wire.h document them; and the committed seeds of
tests/fuzz/corpus/<target>/ (OpenAI request bodies, chat templates).
"""
import base64
import json
import os
import shutil
import struct
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


def tokenizer_json_seeds(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Hello, world! The river runs past the old mill.",
                             "A fox met a crow who held some cheese. 12345"],
                            trainer)
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "add_bos_token": False,
              "chat_template": "{% for message in messages %}{{'<|im_start|>' + "
                               "message['role'] + '\\n' + message['content'] + "
                               "'<|im_end|>' + '\\n'}}{% endfor %}"}
    text = tok.to_str()
    with open(os.path.join(directory, "bpe"), "w") as f:
        f.write(text)
    with open(os.path.join(directory, "bpe_config"), "w") as f:
        f.write(text + "\0" + json.dumps(config))


KV_MAGIC, KV_VERSION = 0x54564B42, 4
LAYER, FINISH, ABORT, STATUS, HELLO, CHALLENGE, PROOF = range(1, 8)


def kv_frame(kind, transfer_id=7, layer=0, layout=(30, 3, 64, 16, 1),
             num_tokens=0, payload_bytes=0, request_id=b"", model_id=b"",
             status_code=0):
    """A kv_wire.h frame header (72 bytes, little-endian)."""
    return struct.pack("<IHHQI5IqQQHHI", KV_MAGIC, KV_VERSION, kind,
                       transfer_id, layer, *layout, num_tokens, payload_bytes,
                       0, len(request_id), len(model_id), status_code)


def kv_wire_seeds(directory):
    seeds = {
        "layer": kv_frame(LAYER, num_tokens=20, payload_bytes=2 * 3 * 64 * 2 * 16,
                          request_id=b"req-1", model_id=b"smollm2")
                 + b"req-1smollm2",
        "finish": kv_frame(FINISH),
        "abort": kv_frame(ABORT, payload_bytes=4, status_code=1) + b"gone",
        "status": kv_frame(STATUS, payload_bytes=2, status_code=3) + b"no",
        "hello": kv_frame(HELLO),
        "challenge": kv_frame(CHALLENGE, payload_bytes=32) + bytes(range(32)),
        "proof": kv_frame(PROOF, payload_bytes=32) + bytes(32),
    }
    # A CUDA IPC verdict granting two blocks, then a refusal.
    grant = (struct.pack("<II", 0x47504B42, 2) + bytes(64)
             + struct.pack("<QQQ", 0, 1 << 20, 8) + struct.pack("<ii", 3, 5))
    seeds["verdicts"] = (kv_frame(STATUS) + struct.pack("<I", len(grant)) + grant
                         + kv_frame(STATUS, payload_bytes=4, status_code=8)
                         + b"full" + struct.pack("<I", 0))
    seeds["grant"] = grant
    for name, data in seeds.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def main():
    out = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("gguf", "safetensors", "tokenizer", "tokenizer_json", "kv_wire"):
        os.makedirs(os.path.join(out, name), exist_ok=True)
    committed = os.path.join(root, "tests", "fuzz", "corpus")
    for name in sorted(os.listdir(committed)):
        shutil.copytree(os.path.join(committed, name), os.path.join(out, name),
                        dirs_exist_ok=True)
    tokenizer_json_seeds(os.path.join(out, "tokenizer_json"))
    kv_wire_seeds(os.path.join(out, "kv_wire"))
    gguf_seed(os.path.join(out, "gguf", "seed.gguf"))
    safetensors_seed(os.path.join(out, "safetensors", "seed.safetensors"))
    with open(os.path.join(out, "tokenizer", "seed_chat"), "w") as f:
        f.write("<|im_start|>user\nHello, world! 12345 héllo 日本語 🙂<|im_end|>\n")
    tokenizer_seeds(os.path.join(out, "tokenizer"),
                    os.path.join(root, "tests", "data", "tokenizer", "corpus.jsonl"))
    json.dump({"ok": True}, sys.stdout)


if __name__ == "__main__":
    main()
