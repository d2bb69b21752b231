#!/usr/bin/env python3
"""Checks baton-sim against real clusters: the fidelity table of docs/planning.md.

    scripts/fidelity.py [--shapes=1P1D,2C] [--loads=0.5,0.85] [--seeds=0,1,2]
                        [--num_prompts=60] [--saturation_prompts=40]
                        [--input_len=256] [--output_len=64] [--range_ratio=0.5]
                        [--goodput="ttft:2000 tpot:40"] [--profile=FILE]
                        [--quick_profile] [--profile_each_shape]
                        [--profile_max_error=0.10]
                        [--out=DIR] [--bin=build/bin] [--report_only]
                        [--check=all|saturation,goodput,ttft_p90,tpot_p90]

1. Without --profile, measures one: `baton-bench profile` on a 1P1D cluster
   of one-thread workers (OUT/profile.json); with --profile_each_shape, one
   right before each shape's cluster (OUT/profile-SHAPE.json), so a host
   whose speed drifts over the run (other tenants) is profiled beside each
   shape's points.
2. For every shape, starts a real cluster (scripts/local_cluster.sh, one
   thread per worker) and measures its capacity: --saturation_prompts
   requests sent at once; capacity = completed requests / seconds from the
   first send to the last answer.
3. At every load (a fraction of that capacity) and seed, runs baton-bench
   (Poisson arrivals) and then baton-sim on exactly what was sent: the
   trace of send times, prompt and output lengths from baton-bench's own
   per-request records, with the profile; every worker of the shape shares
   this host (baton-sim --workers_per_host), so the profile's
   neighbor_slowdown applies between them.
4. Every worker writes its engine steps (OUT/steps-SHAPE/, baton-worker
   --step_trace), and OUT/steps-SHAPE.md holds scripts/step_costs.py's
   table of the saturation burst's steps against the profile. Their time
   over what the profile charges them (its neighbour slowdown included) is
   the host's speed during the burst against its speed while it was
   profiled; the saturation table gives, beside the plain simulated
   throughput, baton-sim's at that speed (the profile's fits scaled by the
   ratio; OUT/raw/SHAPE-saturation-traced-profile.json): what is left of
   the error once the host's drift is taken out. The bound is on the plain
   one.
5. Writes OUT/fidelity.md and OUT/fidelity.json: per shape and load the
   measured and simulated goodput, P90 TTFT and P90 TPOT (means over the
   seeds), the seeds' spread (max - min over the mean of the measured
   values), and whether each is within its bound: goodput +-15%, P90s
   +-20%, or the spread + 10% where that is wider; saturation throughput
   within 5%.

--report_only starts no cluster: it reads a finished run's OUT (the same
workload flags and --shapes, and --profile_each_shape if the run had it),
runs baton-sim again on everything each point sent (with the run's
profiles, and for the bursts at their steps' speed too) and rewrites the
tables: a changed simulator replayed on measured runs.

--check exits 1 when one of the named bounds is missed. The bounds are
timing goals, for a quiet machine (the clusters use every core): the small
ctest case (scripts/fidelity_test.sh) checks none of them: it checks that
the pipeline runs, that baton-sim replayed exactly what was sent, and that
the simulated saturation is within a factor of 3 of the measured one (a
unit or model error, not a fidelity bound).
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="1P1D,2C")
    p.add_argument("--loads", default="0.5,0.85")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num_prompts", type=int, default=60)
    p.add_argument("--saturation_prompts", type=int, default=40)
    p.add_argument("--input_len", type=int, default=256)
    p.add_argument("--output_len", type=int, default=64)
    p.add_argument("--range_ratio", type=float, default=0.5)
    p.add_argument("--goodput", default="ttft:2000 tpot:40")
    p.add_argument("--profile", default="")
    p.add_argument("--quick_profile", action="store_true",
                   help="fewer profiling points (about 30 s)")
    p.add_argument("--profile_each_shape", action="store_true",
                   help="measure a profile right before each shape "
                        "(instead of --profile or one for the whole run)")
    p.add_argument("--profile_max_error", type=float, default=0.10,
                   help="baton-bench profile's limit on a fit's held-out "
                   "error")
    p.add_argument("--out", default="")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--check", default="")
    p.add_argument("--report_only", action="store_true",
                   help="rewrite the tables of a finished run in --out")
    p.add_argument("--points_of", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.shape_list = [s for s in a.shapes.split(",") if s]
    a.load_list = [float(x) for x in a.loads.split(",") if x]
    a.seed_list = [int(x) for x in a.seeds.split(",") if x]
    known = ["saturation", "goodput", "ttft_p90", "tpot_p90"]
    a.check_list = known if a.check == "all" else [
        c for c in a.check.split(",") if c]
    for c in a.check_list:
        if c not in known:
            p.error(f"--check: '{c}' is not one of all, {', '.join(known)}")
    for load in a.load_list:
        if not 0 < load < 1:
            p.error(f"--loads: {load} is not a fraction of capacity in (0, 1)")
    if not a.profile_max_error > 0:
        p.error("--profile_max_error must be a positive fraction")
    if a.num_prompts < 1 or a.saturation_prompts < 1:
        p.error("--num_prompts and --saturation_prompts must be positive")
    if not a.out:
        a.out = time.strftime("fidelity-%Y%m%d-%H%M%S")
    a.out = os.path.abspath(a.out)
    return a


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def workload_flags(a):
    return [f"--random_input_len={a.input_len}",
            f"--random_output_len={a.output_len}",
            f"--random_range_ratio={a.range_ratio}",
            f"--goodput={a.goodput}", "--metric_percentiles=50,90,99"]


def bench(a, name, rate, seed, prompts):
    """One baton-bench point against $BATON_SERVER; returns its JSON."""
    out = os.path.join(a.out, "raw")
    os.makedirs(out, exist_ok=True)
    run([os.path.join(a.bin, "baton-bench"),
         f"--server={os.environ['BATON_SERVER']}",
         f"--num_prompts={prompts}", f"--request_rate={rate}",
         f"--seed={seed}", "--reset_prefix_cache", "--save_result",
         f"--result_dir={out}",
         f"--result_filename={name}.json"] + workload_flags(a),
        stdout=subprocess.DEVNULL)
    with open(os.path.join(out, f"{name}.json")) as f:
        return json.load(f)


def trace_of(result, path):
    """What baton-bench sent, as a baton-sim trace (seconds from the first
    send, prompt tokens, output tokens)."""
    sent = [r for r in result["requests"] if r["sent"]]
    t0 = min(r["send_time_s"] for r in sent)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp_s", "input_len", "output_len"])
        for r in sorted(sent, key=lambda r: r["send_time_s"]):
            out = r["output_tokens"] or r["expected_output_len"]
            w.writerow([f"{r['send_time_s'] - t0:.6f}", r["prompt_tokens"], out])


def workers_of(shape):
    """1P1D -> 2, 2C -> 2: every worker of a shape runs on this host."""
    return sum(int(n) for n in re.findall(r"(\d+)[PDC]", shape))


def simulate(a, shape, name, result, profile=None):
    """baton-sim on what `result` sent, with --profile or `profile`."""
    trace = os.path.join(a.out, "raw", f"{name}.csv")
    trace_of(result, trace)
    path = os.path.join(a.out, "raw", f"{name}-sim.json")
    run([os.path.join(a.bin, "baton-sim"), f"--profile={profile or a.profile}",
         f"--shape={shape}", f"--trace={trace}", f"--goodput={a.goodput}",
         f"--workers_per_host={workers_of(shape)}",
         "--metric_percentiles=50,90,99", "--save_result",
         f"--result_filename={path}"], stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def saturation(result):
    """Completed requests per second from the first send to the last end."""
    done = [r for r in result["requests"] if r["success"]]
    t0 = min(r["send_time_s"] for r in result["requests"] if r["sent"])
    return len(done) / (max(r["end_time_s"] for r in done) - t0)


def p90(result, metric):
    return result[metric].get("p90") if result[metric] else None


def figures(result):
    return {"goodput": result["request_goodput"] or 0.0,
            "throughput": result["request_throughput"],
            "completed": result["completed"],
            "ttft_p90": p90(result, "ttft_ms"),
            "tpot_p90": p90(result, "tpot_ms")}


def points_of(a, shape):
    """Runs inside a cluster of `shape`: every point, measured and simulated."""
    bench(a, f"{shape}-warmup", "inf", 999, 2)
    since = time.monotonic()
    sat = bench(a, f"{shape}-saturation", "inf", 100, a.saturation_prompts)
    until = time.monotonic()
    sat_sim = simulate(a, shape, f"{shape}-saturation", sat)
    capacity = saturation(sat)
    points = {"shape": shape, "capacity": capacity,
              "capacity_sim": sat_sim["request_throughput"],
              "saturation_window": [since, until], "loads": []}
    for load in a.load_list:
        rate = round(load * capacity, 4)
        seeds = []
        for seed in a.seed_list:
            name = f"{shape}-l{load}-s{seed}"
            measured = bench(a, name, rate, seed, a.num_prompts)
            simulated = simulate(a, shape, name, measured)
            seeds.append({"seed": seed, "measured": figures(measured),
                          "simulated": figures(simulated)})
        points["loads"].append({"load": load, "rate": rate, "seeds": seeds})
    with open(os.path.join(a.out, f"points-{shape}.json"), "w") as f:
        json.dump(points, f, indent=2)


def resimulate(a, shape):
    """baton-sim again on every point of a finished run of `shape`."""
    path = os.path.join(a.out, f"points-{shape}.json")
    with open(path) as f:
        pts = json.load(f)
    profile = a.profile or os.path.join(a.out, f"profile-{shape}.json")

    def measured(name):
        with open(os.path.join(a.out, "raw", f"{name}.json")) as f:
            return json.load(f)

    name = f"{shape}-saturation"
    pts["capacity_sim"] = simulate(a, shape, name, measured(name),
                                   profile)["request_throughput"]
    for point in pts["loads"]:
        for seed in point["seeds"]:
            name = f"{shape}-l{point['load']}-s{seed['seed']}"
            seed["simulated"] = figures(
                simulate(a, shape, name, measured(name), profile))
    with open(path, "w") as f:
        json.dump(pts, f, indent=2)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def judge(measured, simulated, bound):
    """(mean measured, mean simulated, relative error, spread, limit, ok)."""
    m, s = mean(measured), mean(simulated)
    vals = [x for x in measured if x is not None]
    spread = (max(vals) - min(vals)) / m if m and len(vals) > 1 else 0.0
    limit = max(bound, spread + 0.10)
    err = abs(s - m) / m if m else (0.0 if not s else float("inf"))
    return m, s, err, spread, limit, err <= limit


def report(a):
    """Writes the tables; returns the checked bounds that were missed."""
    rows, lines, missed = [], [], []
    bounds = {"goodput": 0.15, "ttft_p90": 0.20, "tpot_p90": 0.20}
    lines.append(f"Workload: prompts {a.input_len} +-{a.range_ratio:.0%}, "
                 f"outputs {a.output_len} +-{a.range_ratio:.0%} tokens, Poisson "
                 f"arrivals, {a.num_prompts} requests per seed, seeds "
                 f"{a.seeds}; goodput SLOs `{a.goodput}`; profile "
                 + ("measured before each shape (`profile-SHAPE.json`)"
                    if a.profile_each_shape else
                    f"`{os.path.relpath(a.profile, a.out)}`") + ".\n")
    lines.append("| shape | load | rate req/s | goodput measured / simulated "
                 "| P90 TTFT ms | P90 TPOT ms | seed spread (goodput, TTFT, "
                 "TPOT) | within |")
    lines.append("|---|---:|---:|---|---|---|---|---|")
    sat_lines = []
    for shape in a.shape_list:
        with open(os.path.join(a.out, f"points-{shape}.json")) as f:
            pts = json.load(f)
        err = abs(pts["capacity_sim"] - pts["capacity"]) / pts["capacity"]
        if err > 0.05:
            missed.append(f"{shape} saturation")
        at_speed = "- | -"
        if pts.get("traced"):
            speed, sim = pts["traced"]["ratio"], pts["traced"]["capacity_sim"]
            at_speed = (f"{speed:.3f} | {sim:.3f} "
                        f"({(sim - pts['capacity']) / pts['capacity']:+.1%})")
        sat_lines.append(
            f"| {shape} | {pts['capacity']:.3f} | {pts['capacity_sim']:.3f} "
            f"| {err:.1%} | {'yes' if err <= 0.05 else '**no**'} | {at_speed} |")
        rows.append({"shape": shape, "load": "saturation",
                     "measured": pts["capacity"], "simulated":
                     pts["capacity_sim"], "error": err, "ok": err <= 0.05})
        for point in pts["loads"]:
            cells, spreads, oks = [], [], []
            for metric, bound in bounds.items():
                m, s, e, spread, limit, ok = judge(
                    [x["measured"][metric] for x in point["seeds"]],
                    [x["simulated"][metric] for x in point["seeds"]], bound)
                fmt = "{:.3f}" if metric == "goodput" else "{:.0f}"
                cells.append(f"{fmt.format(m)} / {fmt.format(s)} ({e:+.0%})"
                             .replace("+", "") if m is not None else "-")
                spreads.append(f"{spread:.0%}")
                oks.append(ok)
                rows.append({"shape": shape, "load": point["load"],
                             "metric": metric, "measured": m,
                             "simulated": s, "error": e, "spread": spread,
                             "limit": limit, "ok": ok})
            missed += [f"{shape} {point['load']:.0%} {n}"
                       for n, o in zip(bounds, oks) if not o]
            lines.append(
                f"| {shape} | {point['load']:.0%} | {point['rate']:.3f} | "
                + " | ".join(cells) + f" | {', '.join(spreads)} | "
                + ("yes" if all(oks) else "**no**: " + ", ".join(
                    n for n, o in zip(bounds, oks) if not o)) + " |")
    lines.append("\nSaturation (requests sent at once):\n")
    lines.append("| shape | measured req/s | simulated req/s | error | within 5% "
                 "| burst's steps / charge | simulated at the burst's speed |")
    lines.append("|---|---:|---:|---:|---|---:|---:|")
    lines.extend(sat_lines)
    with open(os.path.join(a.out, "fidelity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "fidelity.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("\n".join(lines))
    return missed


def step_table(a, shape):
    """OUT/steps-SHAPE.md: the saturation burst's steps against the profile;
    then baton-sim on the burst at the speed they ran (points' "traced")."""
    import step_costs  # scripts/, beside this file
    points = os.path.join(a.out, f"points-{shape}.json")
    with open(points) as f:
        pts = json.load(f)
    since, until = pts["saturation_window"]
    folder = os.path.join(a.out, f"steps-{shape}")
    traces = sorted(os.listdir(folder))
    workers = [[s for s in step_costs.load(os.path.join(folder, t))
                if since <= s["start"] < until] for t in traces]
    profile = a.profile or os.path.join(a.out, f"profile-{shape}.json")
    with open(profile) as f:
        fits = json.load(f)
    rows = step_costs.table(fits, workers, 0.02)
    lines = [f"{shape} saturation burst: engine steps against the profile "
             "(scripts/step_costs.py)\n"] + step_costs.markdown(rows)
    with open(os.path.join(a.out, f"steps-{shape}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    ratio = next(r["neighbours_ratio"] for r in rows if r["kind"] == "all")
    if not ratio:
        return
    for phase in ("prefill", "decode"):
        for c in ("c0", "c1", "c2"):
            fits[phase][c] *= ratio
    fits["source"] = (fits.get("source", "") + f"; fits scaled by {ratio} "
                      "to the speed of the saturation burst's steps")
    traced = os.path.join(a.out, "raw",
                          f"{shape}-saturation-traced-profile.json")
    with open(traced, "w") as f:
        json.dump(fits, f, indent=2)
    with open(os.path.join(a.out, "raw", f"{shape}-saturation.json")) as f:
        burst = json.load(f)
    sim = simulate(a, shape, f"{shape}-saturation-traced", burst, traced)
    pts["traced"] = {"ratio": ratio,
                     "capacity_sim": sim["request_throughput"]}
    with open(points, "w") as f:
        json.dump(pts, f, indent=2)


def measure_profile(a, path):
    """Profiles a 1P1D cluster of this host into `path`; returns it."""
    cmd = (f"{a.bin}/baton-bench profile --server=$BATON_SERVER "
           f"--profile_out={path} --profile_name='SmolLM2-135M Q4_1, "
           f"1 thread per worker, this host' "
           f"--profile_max_error={a.profile_max_error}")
    if a.quick_profile:
        cmd += " --profile_quick"
    run(["bash", os.path.join(ROOT, "scripts", "local_cluster.sh"), "1P1D",
         "--no-build", f"--bin={a.bin}", "--", "bash", "-c", cmd])
    return path


def main(argv):
    a = parse_args(argv)
    os.makedirs(os.path.join(a.out, "raw"), exist_ok=True)
    if a.points_of:
        a.profile = os.path.abspath(a.profile)
        points_of(a, a.points_of)
        return 0
    if a.profile_each_shape:
        a.profile = ""
    elif a.profile:
        a.profile = os.path.abspath(a.profile)
    elif a.report_only:
        a.profile = os.path.join(a.out, "profile.json")
    else:
        a.profile = measure_profile(a, os.path.join(a.out, "profile.json"))
    if a.report_only:
        for shape in a.shape_list:
            resimulate(a, shape)
            step_table(a, shape)
        return check(a)
    for shape in a.shape_list:
        profile = a.profile or measure_profile(
            a, os.path.join(a.out, f"profile-{shape}.json"))
        inner = [sys.executable, os.path.abspath(__file__),
                 f"--points_of={shape}", f"--profile={profile}",
                 f"--out={a.out}", f"--bin={a.bin}"] + [
                     f"--{k}={getattr(a, k)}" for k in (
                         "loads", "seeds", "num_prompts", "saturation_prompts",
                         "input_len", "output_len", "range_ratio", "goodput")]
        run(["bash", os.path.join(ROOT, "scripts", "local_cluster.sh"), shape,
             "--no-build", f"--bin={a.bin}",
             f"--step_traces={os.path.join(a.out, f'steps-{shape}')}",
             "--"] + inner)
        step_table(a, shape)
    return check(a)


def check(a):
    """Writes the tables; 1 when a bound of --check is missed."""
    missed = [m for m in report(a)
              if m.split()[-1] in a.check_list]
    if missed:
        print("fidelity: outside the bounds: " + "; ".join(missed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
