#!/usr/bin/env python3
"""Writes the small generated traces baton-sim ships (bench/sim/traces/).

    scripts/make_sim_traces.py [--out=bench/sim/traces] [--seed=1]
                               [--big_mooncake=FILE]

- sample.csv: Baton's own format, `timestamp_s,input_len,output_len`,
  Poisson arrivals at 2 req/s, prompts 128-2048, outputs 16-512 tokens.
- sample-azure.csv: the same requests in the columns of Azure's public LLM
  inference traces, `TIMESTAMP,ContextTokens,GeneratedTokens`.
- sample-mooncake.jsonl: Mooncake's trace format, one JSON object per line
  with `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, one
  id per 512-token piece of the prompt, chained as Mooncake's are (equal ids
  mean equal prefixes). Multi-turn chats: 8 system prompts of 1024 tokens
  shared by 64 conversations of 2-6 turns; each turn resends the whole
  conversation plus a new message of 100-600 tokens, 5-30 s after the
  previous answer.

Generated, not recorded: no real traffic is in them. Deterministic for a
seed, so rerunning this script rewrites the same files.
"""

import argparse
import datetime
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIECE = 512


def plain(rng, n, rate):
    t, rows = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        rows.append((t, rng.randint(128, 2048), rng.randint(16, 512)))
    return rows


def mooncake(rng, conversations=64, rate=0.5):
    next_id = [0]

    def new_ids(count):
        ids = list(range(next_id[0], next_id[0] + count))
        next_id[0] += count
        return ids

    systems = [new_ids(2) for _ in range(8)]  # 1024 tokens each
    rows = []
    start = 0.0
    for _ in range(conversations):
        start += rng.expovariate(rate)
        ids = list(rng.choice(systems))
        length = 2 * PIECE
        prompt = length  # tokens the ids name, all in full pieces
        t = start
        for _ in range(rng.randint(2, 6)):
            length += rng.randint(100, 600)
            # Pieces already named keep their ids (the prefix is the same);
            # the rest of the prompt gets new ones, the last maybe partial.
            pieces = -(-length // PIECE)
            keep = prompt // PIECE
            ids = ids[:keep] + new_ids(pieces - keep)
            prompt = length
            out = rng.randint(32, 400)
            rows.append({"timestamp": int(t * 1000), "input_length": length,
                         "output_length": out, "hash_ids": ids})
            length += out
            t += rng.uniform(5, 30)
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "sim", "traces"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--big_mooncake", default="",
                   help="also write FILE: 25,000 conversations at 400 per "
                   "second (about 100,000 requests), for baton-sim at scale")
    a = p.parse_args()
    if a.big_mooncake:
        with open(a.big_mooncake, "w") as f:
            for r in mooncake(random.Random(a.seed + 2), 25000, 400.0):
                f.write(json.dumps(r) + "\n")
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    rows = plain(rng, 200, 2.0)
    with open(os.path.join(a.out, "sample.csv"), "w") as f:
        f.write("timestamp_s,input_len,output_len\n")
        for t, i, o in rows:
            f.write(f"{t:.3f},{i},{o}\n")
    base = datetime.datetime(2024, 1, 1, 0, 0, 0)
    with open(os.path.join(a.out, "sample-azure.csv"), "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, i, o in rows:
            stamp = base + datetime.timedelta(seconds=t)
            f.write(f"{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{i},{o}\n")
    with open(os.path.join(a.out, "sample-mooncake.jsonl"), "w") as f:
        for r in mooncake(random.Random(a.seed + 1)):
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
