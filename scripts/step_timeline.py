#!/usr/bin/env python3
"""Rebuilds colocated workers' engine steps from a baton-bench result and
compares their durations with a cost profile's fits.

    step_timeline.py PROFILE RESULT.json [RESULT.json ...] [--gap_ms=3]

RESULT is a `baton-bench --save_result` file of a cluster of colocated
(`C`) workers, or baton-sim's (`--save_result`) for the same shape. Each
request's token times (send time + TTFT, then its inter-token gaps) are
grouped per worker (`server.prefill_worker`): tokens less than --gap_ms
apart end one step. A step's decode part is its non-first tokens (batch and
contexts, the profile's decode fit); its prefill part is the rest of the
prompts whose first token it carries plus, first come first served, chunks
of prompts that had arrived and were not finished, up to the profile's
max_batch_tokens (as worker/engine/scheduler.h packs a step). A step lasts
from the previous step's end while the worker held a request, else from
the first arrival among its prompts.

Prints, over every file given, the measured and fitted seconds of all
steps, of the steps that prefilled and of decode-only ones, split by what
the other workers did during more than 80% of the step (idle, decoding,
prefilling): the per-step neighbour slowdowns a profile's
`neighbor_slowdown` stands for. A client-side view: a step that emits no
token (a prompt chunk with nothing decoding) merges into the next one.

Checked on baton-sim's own output, where the answer is known: on run 9's
2C points at 85% of capacity (docs/planning.md) it reads decode-only steps
at 1.000x, 1.002x and 1.119x beside idle, decoding and prefilling workers,
where baton-sim charged 1, 1 and 1.119. On a saturation burst, whose queues
hold many prompts at once, its packing of prompt chunks into steps goes
wrong (1.63x beside a decoding worker, where baton-sim charged 1): read
only points below saturation with it.
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_costs  # noqa: E402  (scripts/, beside this file)


def fit_prefill(profile, lengths):
    if not lengths:
        return 0.0
    c = profile["prefill"]
    return c["c0"] + c["c1"] * sum(lengths) + c["c2"] * sum(l * l for l in lengths)


def fit_decode(profile, contexts):
    if not contexts:
        return 0.0
    return step_costs.decode_seconds(profile, contexts)


def steps_of(result, profile, gap_s):
    requests = {r["index"]: r for r in result["requests"] if r.get("success")}
    tokens = collections.defaultdict(list)
    for r in requests.values():
        t = r["send_time_s"] + r["ttft_ms"] / 1e3
        tokens[r["server"]["prefill_worker"]].append((t, r["index"], 0))
        for k, gap in enumerate(r["itl_ms"]):
            t += gap / 1e3
            tokens[r["server"]["prefill_worker"]].append((t, r["index"], k + 1))
    budget = profile.get("max_batch_tokens", 512)
    steps = []
    for worker, toks in tokens.items():
        toks.sort()
        groups = [[toks[0]]]
        for tok in toks[1:]:
            if tok[0] - groups[-1][-1][0] > gap_s:
                groups.append([tok])
            else:
                groups[-1].append(tok)
        mine = sorted((r for r in requests.values()
                       if r["server"]["prefill_worker"] == worker),
                      key=lambda r: r["send_time_s"])
        remaining = {r["index"]: r["prompt_tokens"] for r in mine}
        prev_end = None
        for group in groups:
            end = max(t for t, _, _ in group)
            decodes = [(i, k) for _, i, k in group if k > 0]
            firsts = [i for _, i, k in group if k == 0]
            start = prev_end
            held = prev_end is not None and any(
                r["send_time_s"] <= prev_end <
                r["send_time_s"] + r["e2el_ms"] / 1e3 - 1e-4 for r in mine)
            if not held:
                arrivals = [requests[i]["send_time_s"] for i in firsts]
                start = min(arrivals) if arrivals else end
            lengths = []
            room = budget - len(decodes)
            for i in firsts:
                lengths.append(remaining[i])
                room -= remaining[i]
                remaining[i] = 0
            for r in mine:
                if room <= 0:
                    break
                i = r["index"]
                if remaining[i] > 0 and r["send_time_s"] < start:
                    chunk = min(room, remaining[i])
                    lengths.append(chunk)
                    remaining[i] -= chunk
                    room -= chunk
            contexts = [requests[i]["prompt_tokens"] + k for i, k in decodes]
            steps.append({
                "worker": worker, "start": start, "end": end,
                "fit": fit_prefill(profile, lengths) + fit_decode(profile, contexts),
                "prefill_tokens": sum(lengths)})
            prev_end = end
    for s in steps:
        s["beside_prefill"] = s["beside_decode"] = 0.0
        length = max(s["end"] - s["start"], 1e-9)
        for o in steps:
            if o["worker"] == s["worker"]:
                continue
            overlap = min(s["end"], o["end"]) - max(s["start"], o["start"])
            if overlap > 0:
                key = "beside_prefill" if o["prefill_tokens"] else "beside_decode"
                s[key] += overlap / length
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--gap_ms", type=float, default=3.0)
    a = ap.parse_args()
    with open(a.profile) as f:
        profile = json.load(f)
    steps = []
    for path in a.results:
        with open(path) as f:
            steps += steps_of(json.load(f), profile, a.gap_ms / 1e3)

    def line(name, chosen):
        if not chosen:
            print(f"{name:34s} none")
            return
        measured = sum(s["end"] - s["start"] for s in chosen)
        fit = sum(s["fit"] for s in chosen)
        print(f"{name:34s} {len(chosen):6d} steps  measured {measured:8.2f} s"
              f"  fit {fit:8.2f} s  {measured / fit:6.3f}x")

    line("all", steps)
    for kind, is_kind in (("prefill steps", lambda s: s["prefill_tokens"] > 0),
                          ("decode-only steps", lambda s: s["prefill_tokens"] == 0)):
        chosen = [s for s in steps if is_kind(s)]
        line(kind, chosen)
        line("  beside idle workers",
             [s for s in chosen if s["beside_prefill"] + s["beside_decode"] < 0.2])
        line("  beside a decoding worker",
             [s for s in chosen if s["beside_decode"] > 0.8])
        line("  beside a prefilling worker",
             [s for s in chosen if s["beside_prefill"] > 0.8])


if __name__ == "__main__":
    main()
