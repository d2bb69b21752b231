#!/usr/bin/env python3
"""Writes sharegpt_sample.json: a small file in the ShareGPT format for the
baton-bench tests (bench/serving/dataset_test.cc, bench_test.cc).

20 usable conversations (a human turn, then a gpt turn) with synthetic text
of known word counts, and 4 malformed entries the loader must skip.

  python3 bench/serving/testdata/make_sharegpt_sample.py
"""
import json
import pathlib
import random

WORDS = ("baton cluster prefill decode worker token cache block layer "
         "request stream latency batch model prompt reply schedule "
         "transfer queue memory").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main():
    rng = random.Random(1234)
    entries = []
    for i in range(20):
        # Prompts of 6..40 words, replies of 8..60 words.
        human = sentence(rng, rng.randint(6, 40))
        gpt = sentence(rng, rng.randint(8, 60))
        entries.append({
            "id": f"sample-{i}",
            "conversations": [
                {"from": "human", "value": human},
                {"from": "gpt", "value": gpt},
                {"from": "human", "value": "and then?"},
            ],
        })
    entries += [
        {"id": "no-conversations"},
        {"id": "gpt-first", "conversations": [
            {"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]},
        {"id": "number-value", "conversations": [
            {"from": "human", "value": 42}, {"from": "gpt", "value": "x y z w"}]},
        "not an object",
    ]
    out = pathlib.Path(__file__).with_name("sharegpt_sample.json")
    out.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"wrote {out} ({len(entries)} entries)")


if __name__ == "__main__":
    main()
