#!/usr/bin/env python3
"""Regenerates the llama.cpp golden file of the engine's reference tests.

    scripts/setup.sh --references      # llama-cpp-python, built from source
    .venv/bin/python scripts/make_references.py [MODEL.gguf]

Writes tests/data/reference/smollm2_llama_cpp.json with, for the default model:
  - "teacher_forced": for each text (prose, code, chat), its token ids and, at
    every position, llama.cpp's top-64 next-token logits (ids and values);
  - "greedy": for 8 prompts, llama.cpp's 64 greedy tokens, with the top-8
    token ids and logits at every step (to judge near-ties where
    implementations diverge).
llama.cpp runs single-threaded on the CPU so the file is reproducible.
"""
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = 64

TEXTS = {
    "prose": (
        "The river had been rising for three days before anyone in the village "
        "thought to move the grain. By the time the elders met in the square, "
        "water was already lapping at the steps of the mill, and the miller's "
        "daughter, who had warned them on the first morning, stood apart with her "
        "arms folded. Nobody apologised. Instead they argued about carts, about "
        "whose barn stood highest, about whether the bridge would hold another "
        "night. In the end it was the children who carried most of the sacks, "
        "two to a sack, laughing as they splashed through the lanes, while their "
        "parents shouted directions that no one followed. When the bridge finally "
        "went, just after midnight, it made almost no sound at all."
    ),
    "code": (
        "def merge_intervals(intervals):\n"
        "    \"\"\"Merge overlapping [start, end] intervals.\"\"\"\n"
        "    if not intervals:\n"
        "        return []\n"
        "    intervals = sorted(intervals, key=lambda iv: iv[0])\n"
        "    merged = [list(intervals[0])]\n"
        "    for start, end in intervals[1:]:\n"
        "        last = merged[-1]\n"
        "        if start <= last[1]:\n"
        "            last[1] = max(last[1], end)\n"
        "        else:\n"
        "            merged.append([start, end])\n"
        "    return merged\n\n\n"
        "class LRUCache:\n"
        "    def __init__(self, capacity: int):\n"
        "        self.capacity = capacity\n"
        "        self.items = {}\n\n"
        "    def get(self, key):\n"
        "        if key not in self.items:\n"
        "            return -1\n"
        "        value = self.items.pop(key)\n"
        "        self.items[key] = value\n"
        "        return value\n"
    ),
    "chat": (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
        "by Hugging Face<|im_end|>\n<|im_start|>user\nCan you explain why the sky "
        "is blue, in a way a ten-year-old would understand?<|im_end|>\n"
        "<|im_start|>assistant\nSure! Sunlight looks white, but it is really a mix "
        "of all the colours of the rainbow. When sunlight comes into our air, it "
        "bumps into tiny bits of gas. Blue light gets bounced around much more "
        "than red or yellow light, because it travels in shorter, choppier waves. "
        "So when you look up, blue light is coming at you from every part of the "
        "sky, and that is why the sky looks blue.<|im_end|>\n<|im_start|>user\n"
        "Then why are sunsets orange?<|im_end|>\n<|im_start|>assistant\n"
    ),
}

GREEDY_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nList three uses of a paperclip.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small town by the sea,",
    "def fibonacci(n):\n",
    "The three laws of thermodynamics are",
    "<|im_start|>user\nTranslate 'good morning' into Spanish.<|im_end|>\n<|im_start|>assistant\n",
    "Q: What is 12 times 7?\nA:",
]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    llm = Llama(model_path=model, n_ctx=2048, n_batch=512, logits_all=True,
                n_threads=1, verbose=False)
    teacher = []
    for name, text in TEXTS.items():
        tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(tokens)
        scores = np.array(llm.scores[: len(tokens)], dtype=np.float32)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :TOP]
        teacher.append({
            "name": name,
            "tokens": tokens,
            "top_ids": top.tolist(),
            "top_logits": np.take_along_axis(scores, top, 1).round(5).tolist(),
        })
    greedy = []
    for prompt in GREEDY_PROMPTS:
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(tokens)
        out, top_ids, top_logits = [], [], []
        for _ in range(64):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits, kind="stable")[:8]
            out.append(int(order[0]))
            top_ids.append([int(i) for i in order])
            top_logits.append([round(float(logits[i]), 5) for i in order])
            llm.eval([int(order[0])])
        greedy.append({"prompt": prompt, "prompt_tokens": tokens, "tokens": out,
                       "top_ids": top_ids, "top_logits": top_logits})
    path = os.path.join(ROOT, "tests", "data", "reference", "smollm2_llama_cpp.json")
    with open(path, "w") as f:
        json.dump({"model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                   "llama_cpp_python": __import__("llama_cpp").__version__,
                   "teacher_forced": teacher, "greedy": greedy}, f)
    print(f"wrote {path}: {sum(len(t['tokens']) for t in teacher)} positions, "
          f"{len(greedy)} greedy prompts")


if __name__ == "__main__":
    main()
