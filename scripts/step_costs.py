#!/usr/bin/env python3
"""Compares the steps real workers took with what a cost profile charges.

    step_costs.py PROFILE TRACE.jsonl [TRACE.jsonl ...] [--busy_gap_ms=20]
                  [--since=SECONDS] [--until=SECONDS] [--by_batch=N]
                  [--json]

Each TRACE is a `baton-worker --step_trace=FILE` of one worker; traces of
workers that shared a host line up (one monotonic clock). A step is charged
as baton-sim and the simulated engine charge it: the prefill fit over its
prompt pieces (cached tokens P, fed N: c1·N + c2·((P+N)² − P²), plus c0
once) plus the decode fit over its decodes (contexts P + 1, batch B). An
item that feeds one token after its sequence's first position is read as a
decode (`StepWork` in worker/engine/cost_profile.h), a prompt's chunk of
exactly one token too, which these workloads' chunk budgets make rare.

A step's time is its forward pass (the trace's seconds) plus the gap to
the worker's next step when that is under --busy_gap_ms (sampling,
streaming the tokens and scheduling the next batch: work a step costs that
the forward pass does not time, and that the profile's decode fit, taken
from the gaps between a client's tokens, includes).

Prints, per kind of step (prefill only, decode only, mixed) and per what
the other traces' workers were doing at the step's middle (idle, decoding,
prefilling: a step with any prompt piece), the steps, their forward and
whole times, the charged time, and whole / charged over the sums and its
median per step; then whole over the time charged with the profile's
neighbor_slowdown too, as baton-sim charges workers that share a host (a
step that prefills slower by its prefill fraction for each other worker
busy at the step's middle, a decode-only step by its decode fraction for
each other that prefills then): over a burst, the host's speed against the
profile's.
"""

import argparse
import bisect
import collections
import json
import statistics


def charged(profile, items):
    """(prefill seconds, decode seconds, kind) of one step's items."""
    prefill = [(p, n) for p, n, _ in items if not (n == 1 and p > 0)]
    decode = [p + 1 for p, n, _ in items if n == 1 and p > 0]
    pre = dec = 0.0
    if prefill:
        c = profile["prefill"]
        pre = (c["c0"] + c["c1"] * sum(n for _, n in prefill) +
               c["c2"] * sum((p + n) ** 2 - p ** 2 for p, n in prefill))
    if decode:
        dec = decode_seconds(profile, decode)
    kind = ("mixed" if prefill and decode else
            "prefill" if prefill else "decode")
    return pre, dec, kind


def batch_factor(profile, batch):
    """The profile's decode_batch_factors at `batch`, as DecodeBatchFactor
    (worker/engine/cost_profile.h): linear between the listed batches, the
    end's beyond them, 1 without any."""
    f = profile.get("decode_batch_factors") or []
    if not f:
        return 1.0
    if batch <= f[0][0]:
        return f[0][1]
    if batch >= f[-1][0]:
        return f[-1][1]
    i = bisect.bisect_left([b for b, _ in f], batch)
    (b0, f0), (b1, f1) = f[i - 1], f[i]
    return f0 + (batch - b0) / (b1 - b0) * (f1 - f0)


def decode_seconds(profile, contexts):
    """A decode batch's fitted time: `contexts` are the tokens each attends
    to (DecodeSeconds)."""
    c = profile["decode"]
    return ((c["c0"] + c["c1"] * sum(contexts) + c["c2"] * len(contexts)) *
            batch_factor(profile, len(contexts)))


def slowdown(profile):
    """The profile's neighbor_slowdown as (prefill, decode) fractions."""
    x = profile.get("neighbor_slowdown", 0)
    if isinstance(x, dict):
        return x.get("prefill", 0), x.get("decode", 0)
    return x, x


def load(path):
    steps = []
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            if s["ok"] and s["items"]:
                steps.append(s)
    steps.sort(key=lambda s: s["start"])
    return steps


def state_at(steps, starts, t):
    """What a worker was doing at time t: idle, decoding or prefilling."""
    i = bisect.bisect_right(starts, t) - 1
    if i < 0 or t >= steps[i]["start"] + steps[i]["seconds"]:
        return "idle"
    return "decoding" if steps[i]["kind"] == "decode" else "prefilling"


def table(profile, workers, busy_gap_s, by_batch=0):
    """The rows printed, from each worker's steps (lists of trace lines);
    with by_batch, decode-only steps are grouped by their batch too
    ("decode x2"; batches from by_batch up in one group, "decode x4+")."""
    for steps in workers:
        for s in steps:
            s["pre"], s["dec"], s["kind"] = charged(profile, s["items"])
    starts = [[s["start"] for s in steps] for steps in workers]
    slow_pre, slow_dec = slowdown(profile)
    groups = collections.defaultdict(list)
    for w, steps in enumerate(workers):
        for i, s in enumerate(steps):
            s["whole"] = s["seconds"]
            if i + 1 < len(steps):
                gap = steps[i + 1]["start"] - s["start"] - s["seconds"]
                if gap < busy_gap_s:
                    s["whole"] += gap
            mid = s["start"] + s["seconds"] / 2
            others = [state_at(workers[o], starts[o], mid)
                      for o in range(len(workers)) if o != w]
            neighbour = ("prefilling" if "prefilling" in others else
                         "decoding" if "decoding" in others else "idle")
            kind = s["kind"]
            if by_batch and kind == "decode":
                b = len(s["items"])
                kind = (f"decode x{b}" if b < by_batch else
                        f"decode x{by_batch}+")
            groups[(kind, neighbour)].append(s)
            # As baton-sim's SharedHosts: a step that prefills is slower by
            # the prefill fraction per busy other, a decode-only step by the
            # decode fraction per other that prefills.
            busy = sum(o != "idle" for o in others)
            if s["pre"] > 0:
                s["beside"] = (s["pre"] + s["dec"]) * (1 + busy * slow_pre)
            else:
                prefilling = sum(o == "prefilling" for o in others)
                s["beside"] = s["dec"] * (1 + prefilling * slow_dec)
    groups[("all", "any")] = [s for steps in workers for s in steps]
    rows = []
    for (kind, neighbour), steps in sorted(groups.items()):
        model = sum(s["pre"] + s["dec"] for s in steps)
        beside = sum(s["beside"] for s in steps)
        whole = sum(s["whole"] for s in steps)
        rows.append({
            "kind": kind, "neighbour": neighbour, "steps": len(steps),
            "forward_s": round(sum(s["seconds"] for s in steps), 4),
            "whole_s": round(whole, 4), "charged_s": round(model, 4),
            "ratio": round(whole / model, 3) if model > 0 else None,
            "median_ratio": round(statistics.median(
                s["whole"] / (s["pre"] + s["dec"]) for s in steps), 3),
            "neighbours_ratio": round(whole / beside, 3) if beside > 0
            else None,
        })
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile")
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--busy_gap_ms", type=float, default=20)
    parser.add_argument("--since", type=float, default=float("-inf"),
                        help="only steps that began at or after this time "
                        "(the monotonic clock's seconds, as Python's "
                        "time.monotonic() reads it)")
    parser.add_argument("--until", type=float, default=float("inf"),
                        help="only steps that began before this time")
    parser.add_argument("--by_batch", type=int, default=0,
                        help="group decode-only steps by batch too, those "
                        "of this batch and more in one group (0: no)")
    parser.add_argument("--json", action="store_true",
                        help="print the table as JSON")
    args = parser.parse_args()
    with open(args.profile) as f:
        profile = json.load(f)
    workers = [[s for s in load(p) if args.since <= s["start"] < args.until]
               for p in args.traces]
    rows = table(profile, workers, args.busy_gap_ms / 1e3, args.by_batch)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("\n".join(markdown(rows)))


def markdown(rows):
    """The table's lines."""
    return ["| step | others | steps | forward s | whole s | charged s "
            "| whole / charged | median per step | whole / charged with "
            "neighbours |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"] + [
        f"| {r['kind']} | {r['neighbour']} | {r['steps']} | "
        f"{r['forward_s']:.3f} | {r['whole_s']:.3f} | "
        f"{r['charged_s']:.3f} | {r['ratio']} | {r['median_ratio']} | "
        f"{r['neighbours_ratio']} |" for r in rows]


if __name__ == "__main__":
    main()
