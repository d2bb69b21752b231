#!/usr/bin/env python3
"""HF tokenizers reference encodings for Baton's tokenizer_hf_test.

Builds genuine tokenizer.json files with the `tokenizers` library from a GGUF
file's vocabulary and merges, one per variant:

  smollm        BPE + pre_tokenizer Sequence[Digits(individual_digits=True),
                ByteLevel(add_prefix_space=False, use_regex=True)] (SmolLM2's
                own pre-tokenizer); also writes tokenizer_config.json beside it
                with bos/eos and the chat template from the GGUF
  llama3_split  same vocabulary, Sequence[Split(Llama-3 regex, Isolated),
                ByteLevel(use_regex=False)], BPE ignore_merges=True
  qwen2_split   same vocabulary, Sequence[Split(Qwen2 regex, Isolated),
                ByteLevel(use_regex=False)]
  removed_ws    same vocabulary, Sequence[Split(\\s+, Removed),
                ByteLevel(use_regex=True)]

All have a ByteLevel decoder and the GGUF's CONTROL tokens as special added
tokens. Writes OUT_DIR/<variant>/tokenizer.json and prints one JSON line per
(variant, corpus string that is valid UTF-8):
  {"variant": str, "name": str, "ids": [int], "decoded": str}

  .venv/bin/python scripts/reference/tokenizer_hf_reference.py \
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --corpus tests/data/tokenizer/corpus.jsonl --out-dir /tmp/x
"""

import argparse
import base64
import json
import os
import sys

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTROL = 3


def read_gguf(path):
    import gguf  # pylint: disable=import-outside-toplevel
    r = gguf.GGUFReader(path)

    def val(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    return {
        "tokens": val("tokenizer.ggml.tokens"),
        "types": val("tokenizer.ggml.token_type"),
        "merges": val("tokenizer.ggml.merges"),
        "bos": val("tokenizer.ggml.bos_token_id"),
        "eos": val("tokenizer.ggml.eos_token_id"),
        "chat_template": val("tokenizer.chat_template"),
    }


def build(meta, pre_tokenizer, ignore_merges=False):
    from tokenizers import AddedToken, Tokenizer, decoders, models  # pylint: disable=import-outside-toplevel
    tokens = meta["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        sys.exit("duplicate tokens in the GGUF vocabulary")
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([
        AddedToken(tokens[i], special=True, normalized=False)
        for i, t in enumerate(meta["types"]) if t == CONTROL
    ])
    return tk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()

    from tokenizers import Regex, pre_tokenizers  # pylint: disable=import-outside-toplevel

    meta = read_gguf(args.gguf)
    variants = {
        "smollm": build(meta, pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])),
        "llama3_split": build(meta, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ignore_merges=True),
        "qwen2_split": build(meta, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
        "removed_ws": build(meta, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="removed", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])),
    }
    for name, tk in variants.items():
        d = os.path.join(args.out_dir, name)
        os.makedirs(d, exist_ok=True)
        tk.save(os.path.join(d, "tokenizer.json"))
    tokens = meta["tokens"]
    with open(os.path.join(args.out_dir, "smollm", "tokenizer_config.json"), "w",
              encoding="utf-8") as f:
        json.dump({"bos_token": tokens[meta["bos"]], "eos_token": tokens[meta["eos"]],
                   "add_bos_token": False, "chat_template": meta["chat_template"]}, f)

    with open(args.corpus, encoding="ascii") as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    out = sys.stdout
    for entry in corpus:
        if not entry["utf8"]:
            continue
        text = base64.b64decode(entry["b64"]).decode("utf-8")
        for name, tk in variants.items():
            ids = tk.encode(text).ids
            out.write(json.dumps({"variant": name, "name": entry["name"], "ids": ids,
                                  "decoded": tk.decode(ids, skip_special_tokens=False)}) + "\n")


if __name__ == "__main__":
    main()
