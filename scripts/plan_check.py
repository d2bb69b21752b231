#!/usr/bin/env python3
"""Checks `baton-bench plan`'s pick against a measured shape sweep.

    scripts/plan_check.py --sweep=DIR --profile=FILE
                          [--goodput="ttft:2500 tpot:50"] [--workers=2]
                          [--tolerance=0.1] [--out=DIR] [--bin=build/bin]

DIR is a scripts/pd_sweep.sh report (its raw/ folder: one baton-bench result
per shape and rate, every shape sent the same seeded schedule). For every
rate:

1. each measured shape's goodput under --goodput, judged from its
   per-request records as scripts/sweep_report.py does (so one sweep can be
   checked under several SLOs), and the best of them;
2. `baton-bench plan --workers=N --trace=...` on exactly what was sent at
   that rate (send times, prompt and output lengths from the first shape's
   records, as scripts/fidelity.py replays a run), with the cost profile;
3. the verdict: right when the plan picks the measured best shape, or a
   shape whose measured goodput is within --tolerance of the best's.

Writes OUT/plan_check.md and OUT/plan_check.json (OUT defaults to
DIR/plan-check) and exits 1 when a pick is wrong. The sweeps are
measurements (run them on a quiet machine); this script only simulates.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fidelity  # noqa: E402  (trace_of)
import sweep_report  # noqa: E402  (parse_slo, load_points)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweep", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--goodput", default="ttft:2500 tpot:50")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--out", default="")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error(f"--workers must be >= 1, got {a.workers}")
    if not 0 <= a.tolerance < 1:
        p.error(f"--tolerance must be in [0, 1), got {a.tolerance}")
    try:
        a.slo = sweep_report.parse_slo(a.goodput)
    except sweep_report.ReportError as e:
        p.error(str(e))
    if not os.path.isfile(a.profile):
        p.error(f"--profile: no file {a.profile}")
    a.out = a.out or os.path.join(a.sweep, "plan-check")
    return a


def plan(a, rate, result):
    """baton-bench plan on the schedule of `result`; its JSON."""
    os.makedirs(a.out, exist_ok=True)
    trace = os.path.join(a.out, f"r{rate}.csv")
    fidelity.trace_of(result, trace)
    path = os.path.join(a.out, f"r{rate}-plan.json")
    cmd = [os.path.join(a.bin, "baton-bench"), "plan", f"--profile={a.profile}",
           f"--workers={a.workers}", f"--goodput={a.goodput}",
           f"--trace={trace}", f"--plan_json={path}"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        raise CheckError(f"{' '.join(cmd)} exited {done.returncode}: "
                         f"{done.stderr.strip()}")
    with open(path) as f:
        return json.load(f)


def check(a):
    points = sweep_report.load_points(a.sweep, a.slo)
    by_rate = {}
    for p in points:
        by_rate.setdefault(p["rate"], []).append(p)
    rows = []
    for rate in sorted(by_rate, key=lambda r: float("inf") if r == "inf" else float(r)):
        measured = {p["shape"]: p for p in by_rate[rate]}
        best = max(measured.values(), key=lambda p: p["goodput"])
        first = sorted(measured)[0]
        with open(os.path.join(a.sweep, "raw", f"{first}-r{rate}.json")) as f:
            predicted = plan(a, rate, json.load(f))
        pick = predicted["recommended"]
        pick_goodput = measured[pick]["goodput"] if pick in measured else None
        right = pick == best["shape"] or (
            pick_goodput is not None
            and pick_goodput >= (1 - a.tolerance) * best["goodput"])
        rows.append({
            "rate": rate,
            "offered_rate": best["offered_rate"],
            "measured_goodput": {s: p["goodput"] for s, p in measured.items()},
            "measured_best": best["shape"],
            "pick": pick,
            "pick_measured_goodput": pick_goodput,
            "predicted_goodput": {r["shape"]: r["goodput"]
                                  for r in predicted["shapes"]},
            "right": right,
        })
    return rows


def report(a, rows):
    shapes = sorted({s for r in rows for s in r["measured_goodput"]})
    lines = [
        f"# Planner against the measured sweep {a.sweep}",
        "",
        f"SLO: {a.goodput}; {a.workers} workers; profile {a.profile}; a pick "
        f"is right when it is the measured best or within "
        f"{100 * a.tolerance:.0f}% of its goodput.",
        "",
        "| rate (offered) | measured goodput " + " / ".join(shapes)
        + " | measured best | plan's pick | predicted goodput "
        + " / ".join(shapes) + " | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        offered = f" ({r['offered_rate']:.2f})" if r["offered_rate"] else ""
        got = " / ".join(f"{r['measured_goodput'].get(s, 0):.3f}" for s in shapes)
        pred = " / ".join(f"{r['predicted_goodput'].get(s, 0):.3f}" for s in shapes)
        lines.append(f"| {r['rate']}{offered} | {got} | {r['measured_best']} | "
                     f"{r['pick']} | {pred} | "
                     f"{'right' if r['right'] else 'WRONG'} |")
    right = sum(r["right"] for r in rows)
    lines += ["", f"{right} of {len(rows)} picks right."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "plan_check.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "plan_check.json"), "w") as f:
        json.dump({"sweep": a.sweep, "goodput": a.goodput, "workers": a.workers,
                   "profile": a.profile, "tolerance": a.tolerance,
                   "rows": rows}, f, indent=2)
    print(text, end="")
    return right == len(rows)


def main(argv):
    a = parse_args(argv)
    try:
        rows = check(a)
    except (CheckError, sweep_report.ReportError, OSError) as e:
        print(f"plan_check: {e}", file=sys.stderr)
        return 2
    return 0 if report(a, rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
