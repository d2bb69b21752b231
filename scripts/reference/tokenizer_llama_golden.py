#!/usr/bin/env python3
"""Writes the llama.cpp tokenization golden file for the default model.

For every string of tests/data/tokenizer/corpus.jsonl, records the ids that
llama.cpp (through llama-cpp-python, vocab only) produces with
parse_special=True and parse_special=False, without BOS. The C++ test
tokenizer_llama_cpp_test compares Baton's tokenizer against this file, which
is the contract: commit it, regenerate it only on purpose.

  .venv/bin/python scripts/reference/tokenizer_llama_golden.py \
      [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out FILE]
"""

import argparse
import base64
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "data", "tokenizer",
                                                     "corpus.jsonl"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "tokenizer",
                                                  "smollm2_llama_cpp_golden.jsonl"))
    args = ap.parse_args()

    import llama_cpp  # pylint: disable=import-outside-toplevel

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    n = 0
    with open(args.corpus, encoding="ascii") as f_in, open(args.out, "w",
                                                           encoding="ascii") as f_out:
        for line in f_in:
            entry = json.loads(line)
            text = base64.b64decode(entry["b64"])
            special = llm.tokenize(text, add_bos=False, special=True)
            plain = llm.tokenize(text, add_bos=False, special=False)
            f_out.write(json.dumps({"name": entry["name"], "special": special,
                                    "plain": plain}) + "\n")
            n += 1
    print("wrote %d golden entries (llama-cpp-python %s) to %s" %
          (n, llama_cpp.__version__, args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
