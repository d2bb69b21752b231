#!/usr/bin/env python3
"""The multi-turn workload of `baton-bench --dataset-name=multiturn` on
llama.cpp (llama-cpp-python), with its RAM prompt cache on or off.

The same shape as Baton's run: conversations sharing a system prompt of
random token ids, every turn resending the whole history (the user messages
and the answers llama.cpp gave), greedy, answers of exactly --output_len
tokens (end-of-sequence is masked out). One request at a time, conversation
after conversation (what baton-bench does at --max-concurrency=1): llama.cpp
serves one request at a time. The Llama object and its cache are the ones
llama-cpp-python's server builds for `--cache true --cache_type ram
--cache_size N` (server/model.py); driving them in process leaves out only
the HTTP hop. Without the RAM cache llama.cpp still reuses the prefix its
context holds from the previous request.

Prints one JSON object: TTFT p50/p90 of first and of later turns, output
tokens per second, wall time.

    python bench/llama_cpp_multiturn.py --model M.gguf --threads 2 --cache ram
"""
import argparse
import json
import random
import statistics
import time

import llama_cpp
import llama_cpp_host
from openai_multiturn import percentile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", choices=["ram", "off"], default="ram")
    ap.add_argument("--cache_size", type=int, default=2 << 30, help="bytes")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system_len", type=int, default=512)
    ap.add_argument("--user_len", type=int, default=64)
    ap.add_argument("--output_len", type=int, default=64)
    ap.add_argument("--vocab", default="1000:40000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra_bufts", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's extra CPU buffer types (bench/llama_cpp_host.py)")
    args = ap.parse_args()
    extra_bufts = llama_cpp_host.configure(args.extra_bufts)

    begin, end = (int(x) for x in args.vocab.split(":"))
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randrange(begin, end) for _ in range(n)]  # noqa: E731
    system = ids(args.system_len)
    users = [[ids(args.user_len) for _ in range(args.turns)]
             for _ in range(args.conversations)]

    llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads,
                          n_threads_batch=args.threads, n_ctx=8192, n_batch=512,
                          verbose=False, seed=args.seed)
    if args.cache == "ram":
        llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=args.cache_size))
    no_eos = {llm.token_eos(): -1e9}

    first, later = [], []
    out_tokens = 0
    start = time.perf_counter()
    for c in range(args.conversations):
        history = list(system)
        for t in range(args.turns):
            history += users[c][t]
            sent = time.perf_counter()
            ttft = None
            answer = []
            for chunk in llm.create_completion(
                    prompt=history, max_tokens=args.output_len, temperature=0.0,
                    stream=True, logit_bias=no_eos, logprobs=None):
                if ttft is None:
                    ttft = (time.perf_counter() - sent) * 1e3
                answer.append(chunk["choices"][0]["text"])
            # The answer's tokens as the model produced them: re-tokenizing
            # the text may split differently, so take the context's tokens.
            produced = list(llm._input_ids[len(history):])
            out_tokens += len(produced) if produced else args.output_len
            history += produced
            (first if t == 0 else later).append(ttft)
    wall = time.perf_counter() - start
    print(json.dumps({
        "cache": args.cache, "cache_size": args.cache_size,
        "extra_bufts": extra_bufts,
        "threads": args.threads, "duration_s": wall,
        "output_tokens_per_s": out_tokens / wall,
        "first_turns": {"turns": len(first), "ttft_ms_p50": statistics.median(first),
                        "ttft_ms_p90": percentile(first, 90)},
        "later_turns": {"turns": len(later), "ttft_ms_p50": statistics.median(later),
                        "ttft_ms_p90": percentile(later, 90)},
    }))


if __name__ == "__main__":
    main()
