#!/usr/bin/env python3
"""Turns a folder of baton-bench results into a shape-comparison report.

    sweep_report.py OUT [--title=TEXT] [--shapes=2C,1P1D] [--total_threads=N]
                        [--attainment=0.9] [--no-plots]
                        [--goodput="ttft:MS tpot:MS e2el:MS" --report_dir=DIR]

Reads OUT/raw/SHAPE-rRATE.json (one `baton-bench --save-result` file per
point, as scripts/pd_sweep.sh writes them) and writes (into --report_dir,
default OUT):
  OUT/points.csv          one row per (shape, rate)
  OUT/goodput.png         goodput (req/s) vs offered rate, one line per shape
  OUT/ttft.png            TTFT p50 and p99 vs rate
  OUT/tpot.png            TPOT p50 and p99 vs rate
  OUT/summary.md          the tables and the recommendation

Goodput at a point is the rate of requests that met every SLO (DistServe's
per-request definition, as baton-bench reports it); SLO attainment is their
share of the requests sent. The recommendation at each rate is the shape
with the highest goodput (then higher attainment, then lower p99 TTFT; others
within 5% of its goodput are named as ties); a
shape's capacity is the highest rate at which its attainment is at least
--attainment. --goodput judges the same runs under other SLOs: each point's
good requests are recounted from its per-request records.
"""

import argparse
import csv
import json
import math
import os
import re
import sys

# Goodputs this close to the best are reported as a tie: below capacity every
# shape serves what is offered, and run-to-run noise on a shared host is
# several percent.
TIE = 0.05

POINT_FILE = re.compile(r"^(?P<shape>(?:\d+[PDC])+)-r(?P<rate>[0-9.]+|inf)\.json$")

COLUMNS = [
    "shape", "rate", "offered_rate", "num_requests", "completed", "failed", "duration_s",
    "request_throughput", "output_throughput", "good_requests", "goodput",
    "slo_attainment", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
    "e2el_p50_ms", "e2el_p99_ms", "client_cpu_percent",
]


class ReportError(Exception):
    pass


def rate_value(rate):
    return math.inf if rate == "inf" else float(rate)


def _dist(result, name, key):
    value = result.get(name, {}).get(key)
    return None if value is None else float(value)


SLO_METRICS = ("ttft", "tpot", "e2el")


def parse_slo(text):
    """"ttft:500 tpot:50" (or comma separated) -> {"ttft_ms": 500.0, ...}."""
    slo = {}
    for item in text.replace(",", " ").split():
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ReportError(f"--goodput: '{item}' is not METRIC:MS with METRIC one of "
                              + ", ".join(SLO_METRICS))
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not ms > 0:
            raise ReportError(f"--goodput: '{item}' needs a positive number of milliseconds")
        slo[f"{name}_ms"] = ms
    if not slo:
        raise ReportError("--goodput is empty")
    return slo


def count_good(result, slo):
    """Requests of `result` that completed and met every SLO in `slo`."""
    good = 0
    for r in result.get("requests", []):
        if not r.get("success"):
            continue
        ok = True
        for key, limit in slo.items():
            value = r.get(key)
            # TPOT is undefined for one-token outputs: nothing to violate.
            if value is not None and value > limit:
                ok = False
        good += ok
    return good


def load_points(out_dir, slo=None):
    raw = os.path.join(out_dir, "raw")
    if not os.path.isdir(raw):
        raise ReportError(f"no folder {raw}: run scripts/pd_sweep.sh first")
    points = []
    for name in sorted(os.listdir(raw)):
        match = POINT_FILE.match(name)
        if not match:
            continue
        path = os.path.join(raw, name)
        try:
            with open(path, encoding="utf-8") as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            raise ReportError(f"{path}: not a baton-bench result ({e})") from e
        if not isinstance(result, dict) or "num_requests" not in result:
            raise ReportError(f"{path}: not a baton-bench result (no num_requests)")
        if slo is None and result.get("request_goodput") is None:
            raise ReportError(f"{path}: the run had no --goodput SLO")
        sent = int(result["num_requests"])
        if slo is None:
            good = int(result["good_requests"])
            goodput = float(result["request_goodput"])
        else:
            if "requests" not in result:
                raise ReportError(f"{path}: no per-request records to judge --goodput by")
            good = count_good(result, slo)
            duration = float(result["duration_s"])
            goodput = good / duration if duration > 0 else 0.0
            result["slo"] = {k: slo.get(k) for k in ("ttft_ms", "tpot_ms", "e2el_ms")}
        # The rate the schedule actually offered: requests over the span of
        # their send times (a short Poisson run can differ from the nominal
        # rate by tens of percent).
        sends = sorted(float(r["send_time_s"]) for r in result.get("requests", [])
                       if r.get("sent", True) and r.get("send_time_s") is not None)
        offered = (len(sends) - 1) / (sends[-1] - sends[0]) \
            if len(sends) > 1 and sends[-1] > sends[0] else None
        points.append({
            "shape": match["shape"],
            "rate": match["rate"],
            "offered_rate": offered,
            "num_requests": sent,
            "completed": int(result["completed"]),
            "failed": int(result["failed"]) + int(result.get("aborted", 0))
                      + int(result.get("not_sent", 0)),
            "duration_s": float(result["duration_s"]),
            "request_throughput": float(result["request_throughput"]),
            "output_throughput": float(result["output_throughput"]),
            "good_requests": good,
            "goodput": goodput,
            "slo_attainment": good / sent if sent else 0.0,
            "ttft_p50_ms": _dist(result, "ttft_ms", "median"),
            "ttft_p90_ms": _dist(result, "ttft_ms", "p90"),
            "ttft_p99_ms": _dist(result, "ttft_ms", "p99"),
            "tpot_p50_ms": _dist(result, "tpot_ms", "median"),
            "tpot_p90_ms": _dist(result, "tpot_ms", "p90"),
            "tpot_p99_ms": _dist(result, "tpot_ms", "p99"),
            "itl_p50_ms": _dist(result, "itl_ms", "median"),
            "itl_p99_ms": _dist(result, "itl_ms", "p99"),
            "e2el_p50_ms": _dist(result, "e2el_ms", "median"),
            "e2el_p99_ms": _dist(result, "e2el_ms", "p99"),
            "client_cpu_percent": float(
                result.get("bench_client", {}).get("cpu_percent_of_one_core", 0.0)),
            "slo": result.get("slo", {}),
        })
    if not points:
        raise ReportError(f"no SHAPE-rRATE.json results in {raw}")
    return points


def shape_order(points, shapes_arg):
    seen = []
    for shape in (shapes_arg.split(",") if shapes_arg else []):
        if shape and shape not in seen:
            seen.append(shape)
    for p in points:
        if p["shape"] not in seen:
            seen.append(p["shape"])
    return [s for s in seen if any(p["shape"] == s for p in points)]


def rate_order(points):
    return sorted({p["rate"] for p in points}, key=rate_value)


def winner(candidates):
    """The best point of one rate: goodput, then attainment, then p99 TTFT."""
    def key(p):
        ttft = p["ttft_p99_ms"] if p["ttft_p99_ms"] is not None else math.inf
        return (-p["goodput"], -p["slo_attainment"], ttft, p["shape"])
    return sorted(candidates, key=key)[0]


def capacity(points, shape, attainment):
    """Highest rate at which `shape` met the SLOs for >= attainment."""
    ok = [p for p in points if p["shape"] == shape and p["slo_attainment"] >= attainment]
    if not ok:
        return None
    return max(ok, key=lambda p: rate_value(p["rate"]))["rate"]


def write_csv(points, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for p in points:
            writer.writerow({k: ("" if p[k] is None else p[k]) for k in COLUMNS})


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def slo_text(points):
    slo = points[0]["slo"]
    parts = [f"{name.split('_')[0].upper()} ≤ {slo[name]:g} ms"
             for name in ("ttft_ms", "tpot_ms", "e2el_ms") if slo.get(name) is not None]
    return ", ".join(parts) if parts else "none"


def write_summary(points, shapes, rates, args, path, plots):
    by = {(p["shape"], p["rate"]): p for p in points}
    lines = [f"# Shape sweep: {args.title}", ""]
    threads = f"{args.total_threads} compute threads in every shape; " if args.total_threads else ""
    lines.append(f"{threads}SLO: {slo_text(points)}; SLO attainment target for capacity: "
                 f"{args.attainment:.0%}.")
    lines.append("")
    lines.append("## Recommendation")
    lines.append("")
    lines.append("| rate (req/s) | best shape | its goodput (req/s) | SLO attainment |")
    lines.append("| --- | --- | --- | --- |")
    for rate in rates:
        candidates = [by[(s, rate)] for s in shapes if (s, rate) in by]
        best = winner(candidates)
        tied = [c["shape"] for c in candidates
                if c is not best and c["goodput"] >= (1.0 - TIE) * best["goodput"]]
        name = f"**{best['shape']}**" + (
            f" (tie: {', '.join(tied)} within {TIE:.0%})" if tied else "")
        lines.append(f"| {rate} | {name} | {best['goodput']:.3f} | "
                     f"{best['slo_attainment']:.0%} |")
    lines.append("")
    caps = {s: capacity(points, s, args.attainment) for s in shapes}
    ranked = sorted(shapes, key=lambda s: (-(rate_value(caps[s]) if caps[s] else -1.0), s))
    for s in ranked:
        cap = caps[s]
        lines.append(f"- **{s}** meets the SLOs for ≥ {args.attainment:.0%} of requests up to "
                     + (f"{cap} req/s (highest rate tried)." if cap else "none of the rates tried."))
    lines.append("")
    lines.append("Rates are the nominal Poisson rates; the offered rate in brackets below is what the "
                 "seeded schedule actually sent (requests − 1 over the span of their send times).")
    lines.append("")
    lines.append("## Every point")
    lines.append("")
    lines.append("| shape | rate (offered) | done / sent | goodput | attainment | "
                 "TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2EL p50 ms | out tok/s | "
                 "client CPU % |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in shapes:
        for rate in rates:
            p = by.get((s, rate))
            if p is None:
                continue
            lines.append(
                f"| {s} | {rate} ({fmt(p['offered_rate'], 2)}) | "
                f"{p['completed']} / {p['num_requests']} | "
                f"{p['goodput']:.3f} | {p['slo_attainment']:.0%} | "
                f"{fmt(p['ttft_p50_ms'])} / {fmt(p['ttft_p99_ms'])} | "
                f"{fmt(p['tpot_p50_ms'])} / {fmt(p['tpot_p99_ms'])} | "
                f"{fmt(p['e2el_p50_ms'], 0)} | {p['output_throughput']:.1f} | "
                f"{p['client_cpu_percent']:.0f} |")
    lines.append("")
    if plots:
        lines.append("## Plots")
        lines.append("")
        for name, caption in plots:
            lines.append(f"![{caption}]({name})")
            lines.append("")
    raw = os.path.relpath(os.path.join(args.out, "raw"), os.path.dirname(os.path.abspath(path)))
    lines.append(f"Raw baton-bench results: `{raw}/`; every point: `points.csv`.")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def write_plots(points, shapes, rates, out_dir, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rates)))
    by = {(p["shape"], p["rate"]): p for p in points}

    def series(shape, key):
        xs, ys = [], []
        for i, rate in enumerate(rates):
            p = by.get((shape, rate))
            if p is not None and p[key] is not None:
                xs.append(i)
                ys.append(p[key])
        return xs, ys

    def finish(ax, ylabel, name, caption):
        ax.set_xticks(x)
        ax.set_xticklabels(rates)
        ax.set_xlabel("nominal request rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{caption}\n{title}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.figure.tight_layout()
        ax.figure.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(ax.figure)
        return name, caption

    plots = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for s in shapes:
        ax.plot(*series(s, "goodput"), marker="o", label=f"{s} goodput")
        ax.plot(*series(s, "request_throughput"), linestyle=":", marker=".",
                label=f"{s} throughput")
    plots.append(finish(ax, "requests/s", "goodput.png", "Goodput under the SLO vs rate"))
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for s in shapes:
            line, = ax.plot(*series(s, f"{metric}_p50_ms"), marker="o", label=f"{s} p50")
            ax.plot(*series(s, f"{metric}_p99_ms"), marker="^", linestyle="--",
                    color=line.get_color(), label=f"{s} p99")
        ax.set_yscale("log")
        plots.append(finish(ax, f"{label} (ms, log scale)", f"{metric}.png",
                            f"{label} percentiles vs rate"))
    return plots


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--title", default="shape sweep")
    parser.add_argument("--shapes", default="")
    parser.add_argument("--total_threads", type=int, default=0)
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--goodput", default=None)
    parser.add_argument("--report_dir", default=None)
    args = parser.parse_args(argv)
    if not 0.0 < args.attainment <= 1.0:
        print("sweep_report: --attainment must be in (0, 1]", file=sys.stderr)
        return 2
    try:
        slo = parse_slo(args.goodput) if args.goodput is not None else None
    except ReportError as e:
        print(f"sweep_report: {e}", file=sys.stderr)
        return 2
    try:
        points = load_points(args.out, slo)
    except ReportError as e:
        print(f"sweep_report: {e}", file=sys.stderr)
        return 1
    report_dir = args.report_dir or args.out
    os.makedirs(report_dir, exist_ok=True)
    shapes = shape_order(points, args.shapes)
    rates = rate_order(points)
    points.sort(key=lambda p: (shapes.index(p["shape"]), rate_value(p["rate"])))
    write_csv(points, os.path.join(report_dir, "points.csv"))
    plots = [] if args.no_plots else write_plots(points, shapes, rates, report_dir, args.title)
    write_summary(points, shapes, rates, args, os.path.join(report_dir, "summary.md"), plots)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
