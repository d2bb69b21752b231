#!/usr/bin/env python3
"""llama.cpp's decode and prefill speed on a GGUF file, for bench/engine_bench.

Uses llama-cpp-python's low-level API (no sampling, as llama-bench): decode at
batch B is B sequences of a 32-token prompt stepping together one token each;
prefill is one sequence's N-token prompt in a single batch. Prints JSON:
  {"decode": {"1": tok_per_s, ...}, "prefill": {"128": tok_per_s, ...}}

    python bench/llama_cpp_bench.py --model M.gguf --threads 2
"""
import argparse
import json
import time

import llama_cpp as L
import llama_cpp_host

_quiet = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt_lens", default="128,1024")
    ap.add_argument("--decode_tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--extra_bufts", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's extra CPU buffer types (bench/llama_cpp_host.py)")
    args = ap.parse_args()
    extra_bufts = llama_cpp_host.configure(args.extra_bufts)
    batches = [int(b) for b in args.batches.split(",")]
    prompt_lens = [int(n) for n in args.prompt_lens.split(",")]

    L.llama_backend_init()
    # Silence llama.cpp's log (the callback object must outlive the run).
    global _quiet
    _quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(_quiet, None)
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = 8192
    cp.n_batch = max(prompt_lens + [max(batches) * 32])
    cp.n_ubatch = cp.n_batch
    cp.n_seq_max = max(batches)
    cp.kv_unified = True  # all sequences share n_ctx, like Baton's pool
    cp.n_threads = args.threads
    cp.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    batch = L.llama_batch_init(cp.n_batch, 0, cp.n_seq_max)
    mem = L.llama_get_memory(ctx)

    def run(entries):  # entries: (token, pos, seq, want_logits)
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, out) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = out
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        L.llama_synchronize(ctx)

    def token(i):
        return 100 + (i * 7919) % (min(n_vocab, 40000) - 200)

    result = {"decode": {}, "prefill": {}, "extra_bufts": extra_bufts}
    for n in prompt_lens:
        best = 1e30
        for _ in range(args.reps):
            L.llama_memory_clear(mem, True)
            t0 = time.perf_counter()
            run([(token(i), i, 0, i == n - 1) for i in range(n)])
            best = min(best, time.perf_counter() - t0)
        result["prefill"][str(n)] = n / best
    for b in batches:
        best = 1e30
        for _ in range(args.reps):
            L.llama_memory_clear(mem, True)
            run([(token(s * 32 + i), i, s, i == 31) for s in range(b) for i in range(32)])
            t0 = time.perf_counter()
            for step in range(args.decode_tokens):
                run([(token(s + step), 32 + step, s, True) for s in range(b)])
            best = min(best, time.perf_counter() - t0)
        result["decode"][str(b)] = b * args.decode_tokens / best
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
