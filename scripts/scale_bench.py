#!/usr/bin/env python3
"""The real coordinator at scale, with simulated-engine worker processes.

    scripts/scale_bench.py [--workers=8,32,64] [--streams=1000,5000,10000]
                           [--rate=250] [--warmup=200] [--idle_s=10]
                           [--input_len=4] [--simulate_kv_transfers]
                           [--coordinator_flag=FLAG ...]
                           [--coordinator_cpus=0]
                           [--worker_cpus=1] [--client_cpus=1]
                           [--out=DIR] [--bin=build/bin]

For every worker count W, starts a split cluster of W/2 prefill and W/2
decode workers that run `baton-worker --engine=simulated` (the real worker
service, control plane, KV reservations and transfers; steps that compute
nothing), pinned with the coordinator and the client to the stated CPUs.
After --warmup short requests that are not measured (so every channel
from the coordinator to a worker is connected and the processes settled),
for every stream count N, baton-bench sends N requests at --rate per
second, each a 4-token prompt (--input_len) and 8 tokens of answer whose decode steps
take 6 s (so every stream stays open for 48 s: at the default 250 requests
per second all N are in flight at once up to N = 12,000), and this
reports from the per-request records and /proc:

- the coordinator's added latency: its own time from a request's arrival to
  its first token (GenerateResult.timings.ttft_ms) minus the prefill
  worker's own time for it (prefill_ms, which includes the worker's queue):
  routing, bookkeeping, the RPC hops and forwarding; p50 and p99;
- errors; the coordinator's CPU seconds per request (from /proc/PID/stat)
  and its RSS at the end of each point (VmRSS) and peak (VmHWM);
- the coordinator's idle CPU (per second, over --idle_s after the warm-up,
  no request in flight: heartbeats, sweeps, gRPC's channel upkeep, which
  grow with the workers, not the requests) and the CPU per request net of
  it (the point's CPU minus the idle rate times the point's duration); the
  workers' idle CPU, all together (they share --worker_cpus); each CPU's
  busy share over the point (/proc/stat), which tells a coordinator that
  is behind from workers and a client that are.

With --simulate_kv_transfers the workers' KV handoffs carry no bytes (the
worker flag of that name: simulated layer frames, paced by the profile's
transfer model) and their pools are not committed at start (nothing is
ever written to them); otherwise every handoff moves its prompt's KV over
loopback, and the pools are committed (--kv_prefault).

Writes OUT/scale.md and OUT/scale.json. A benchmark, not a test: run it on a
quiet machine.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prefill 1 ms, decode steps of 6 s: the workers add almost nothing before
# the first token and hold every stream open for 48 s.
PROFILE = {
    "name": "scale bench: 1 ms prefill, 6 s decode steps",
    "source": "scripts/scale_bench.py",
    "prefill": {"c0": 0.001, "c1": 0.0, "c2": 0.0},
    "decode": {"c0": 6.0, "c1": 0.0, "c2": 0.0},
    "transfer": {"alpha_s": 0.0, "bytes_per_s": 1e10},
    "kv_bytes_per_token": 23040, "kv_blocks": 4096, "block_size": 16,
    "max_batch_tokens": 4096, "max_num_seqs": 4096,
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="8,32,64")
    p.add_argument("--streams", default="1000,5000,10000")
    p.add_argument("--rate", type=float, default=250)
    p.add_argument("--coordinator_cpus", default="0")
    p.add_argument("--worker_cpus", default="1")
    p.add_argument("--client_cpus", default="1")
    p.add_argument("--warmup", type=int, default=200,
                   help="short requests sent before the points, unmeasured "
                        "(at least 4 per worker; 0: none)")
    p.add_argument("--idle_s", type=float, default=10,
                   help="seconds of idle coordinator CPU measured after the "
                        "warm-up (0: not measured)")
    p.add_argument("--input_len", type=int, default=4,
                   help="prompt tokens of each measured request")
    p.add_argument("--simulate_kv_transfers", action="store_true",
                   help="KV handoffs without bytes (baton-worker's flag)")
    p.add_argument("--coordinator_flag", action="append", default=[],
                   help="an extra baton-coordinator flag (repeatable), "
                        "e.g. --heartbeat_ms=2000")
    p.add_argument("--out", default="")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--points_of", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.worker_list = [int(x) for x in a.workers.split(",") if x]
    a.stream_list = sorted(int(x) for x in a.streams.split(",") if x)
    for w in a.worker_list:
        if w < 2 or w % 2:
            p.error(f"--workers: {w} is not an even count >= 2")
    if not a.out:
        a.out = time.strftime("scale-%Y%m%d-%H%M%S")
    a.out = os.path.abspath(a.out)
    return a


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def cpu_ticks():
    """{cpu index: (busy, total)} jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *v = line.split()
            if name.startswith("cpu") and name != "cpu":
                v = [int(x) for x in v]
                idle = v[3] + v[4]  # idle + iowait
                out[int(name[3:])] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def busy_shares(before, after):
    """Each CPU's busy share between two cpu_ticks() readings, "cpuN 97%"."""
    parts = []
    for cpu in sorted(after):
        busy = after[cpu][0] - before.get(cpu, (0, 0))[0]
        total = after[cpu][1] - before.get(cpu, (0, 0))[1]
        parts.append(f"cpu{cpu} {100 * busy / max(1, total):.0f}%")
    return ", ".join(parts)


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def warm_up(a, workers):
    """Sends a.warmup short requests first (not measured): every
    coordinator-to-worker channel connects and the processes settle."""
    if a.warmup <= 0:
        return
    cmd = [os.path.join(a.bin, "baton-bench"),
           f"--server={os.environ['BATON_SERVER']}",
           f"--num_prompts={max(a.warmup, 4 * workers)}",
           f"--request_rate={a.rate}", "--random_input_len=4",
           "--random_output_len=2", f"--cpus={a.client_cpus}",
           "--request_timeout_s=600"]
    print("+ warm-up: " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)


def idle_cpu_per_s(a, pids):
    """CPU seconds per second of each process with no request in flight."""
    if a.idle_s <= 0:
        return [0.0] * len(pids)
    cpu0, t0 = [proc_cpu_s(p) for p in pids], time.monotonic()
    time.sleep(a.idle_s)
    elapsed = time.monotonic() - t0
    return [(proc_cpu_s(p) - c) / elapsed for p, c in zip(pids, cpu0)]


def points_of(a, workers):
    pids = [int(p) for p in os.environ["BATON_PIDS"].split()]
    coordinator = pids[0]
    warm_up(a, workers)
    idle_each = idle_cpu_per_s(a, pids)
    idle, idle_workers = idle_each[0], sum(idle_each[1:])
    print(f"+ idle CPU: coordinator {1e3 * idle:.1f} ms/s, the {workers} "
          f"workers {1e3 * idle_workers:.1f} ms/s", file=sys.stderr, flush=True)
    rows = []
    for n in a.stream_list:
        name = f"w{workers}-n{n}"
        cpu0, t0 = proc_cpu_s(coordinator), time.monotonic()
        ticks0 = cpu_ticks()
        cmd = [os.path.join(a.bin, "baton-bench"),
               f"--server={os.environ['BATON_SERVER']}",
               f"--num_prompts={n}", f"--request_rate={a.rate}",
               f"--random_input_len={a.input_len}", "--random_output_len=8",
               f"--cpus={a.client_cpus}", "--request_timeout_s=600",
               "--save_result", f"--result_dir={a.out}",
               f"--result_filename={name}.json"]
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, stdout=subprocess.DEVNULL)
        cpu = proc_cpu_s(coordinator) - cpu0
        shares = busy_shares(ticks0, cpu_ticks())
        busy = cpu - idle * (time.monotonic() - t0)
        with open(os.path.join(a.out, f"{name}.json")) as f:
            result = json.load(f)
        ok = [r for r in result["requests"] if r["success"]]
        srv = [r["server"] for r in ok]
        added = [s["ttft_ms"] - s["prefill_ms"] for s in srv]
        # The added latency in three parts: the ReserveKv round trip to the
        # decode worker, the coordinator's own time before the Prefill call
        # leaves it (queue_ms less that round trip, unless the reservation
        # was made beside the Prefill, the default), and the Prefill
        # round trip less the worker's compute (from the call leaving to the
        # first token leaving the coordinator).
        reserve = [s.get("reserve_kv_ms", 0) for s in srv]
        before = [s["queue_ms"] - (0 if s.get("reserve_kv_beside_prefill")
                                   else s.get("reserve_kv_ms", 0))
                  for s in srv]
        after = [s["ttft_ms"] - s["queue_ms"] - s["prefill_ms"] for s in srv]
        rows.append({
            "workers": workers, "streams": n,
            "completed": len(ok), "errors": n - len(ok),
            "added_p50_ms": percentile(added, 50),
            "added_p99_ms": percentile(added, 99),
            "reserve_kv_p50_ms": percentile(reserve, 50),
            "reserve_kv_p99_ms": percentile(reserve, 99),
            "own_before_prefill_p50_ms": percentile(before, 50),
            "prefill_hop_p50_ms": percentile(after, 50),
            "client_ttft_p50_ms": result["ttft_ms"].get("median"),
            "coordinator_cpu_ms_per_request": 1e3 * cpu / max(1, n),
            "coordinator_idle_cpu_ms_per_s": 1e3 * idle,
            "workers_idle_cpu_ms_per_s": 1e3 * idle_workers,
            "coordinator_net_cpu_ms_per_request": 1e3 * busy / max(1, n),
            "coordinator_rss_mib": proc_kib(coordinator, "VmRSS") / 1024,
            "coordinator_hwm_mib": proc_kib(coordinator, "VmHWM") / 1024,
            "coordinator_threads": proc_kib(coordinator, "Threads"),
            "cpu_busy": shares,
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    with open(os.path.join(a.out, f"points-w{workers}.json"), "w") as f:
        json.dump(rows, f, indent=2)


def report(a):
    rows = []
    for w in a.worker_list:
        with open(os.path.join(a.out, f"points-w{w}.json")) as f:
            rows += json.load(f)
    lines = ["| workers | streams | coordinator added latency p50 / p99 ms | "
             "p50 parts: own before Prefill, ReserveKv round trip, Prefill "
             "hop | "
             "errors | coordinator CPU ms per request (net of idle) | "
             "idle CPU ms/s: coordinator, workers | coordinator RSS MiB "
             "(peak) | threads | CPUs busy |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]

    def ms(r, key):
        v = r.get(key)
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['streams']:,} | {r['added_p50_ms']:.2f} / "
            f"{r['added_p99_ms']:.2f} | {ms(r, 'own_before_prefill_p50_ms')}, "
            f"{ms(r, 'reserve_kv_p50_ms')}, {ms(r, 'prefill_hop_p50_ms')} | "
            f"{r['errors']} | "
            f"{r['coordinator_cpu_ms_per_request']:.2f} "
            f"({r.get('coordinator_net_cpu_ms_per_request', 0):.2f}) | "
            f"{r.get('coordinator_idle_cpu_ms_per_s', 0):.0f}, "
            f"{r.get('workers_idle_cpu_ms_per_s', 0):.0f} | "
            f"{r['coordinator_rss_mib']:.0f} ({r['coordinator_hwm_mib']:.0f}) | "
            f"{r['coordinator_threads']} | {r.get('cpu_busy', '')} |")
    with open(os.path.join(a.out, "scale.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "scale.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("\n".join(lines))


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.points_of:
        points_of(a, int(a.points_of))
        return 0
    profile = os.path.join(a.out, "profile.json")
    with open(profile, "w") as f:
        json.dump(PROFILE, f, indent=2)
    block_mib = 16 * PROFILE["kv_bytes_per_token"] / 2**20
    blocks = (a.input_len + 8 + 15) // 16  # of each stream
    for w in a.worker_list:
        # Every stream's blocks on one of W/2 decode workers, with room to
        # spare; the pools are committed at start (--kv_prefault), so the
        # first requests do not wait for the workers' page faults, unless
        # the transfers are simulated (no byte of a pool is ever written).
        kv_mib = max(64, int(1.5 * block_mib * blocks * max(a.stream_list) /
                             (w // 2)))
        kv_flags = (["--worker_flag=--simulate_kv_transfers"]
                    if a.simulate_kv_transfers
                    else ["--worker_flag=--kv_prefault"])
        inner = [sys.executable, os.path.abspath(__file__),
                 f"--points_of={w}", f"--out={a.out}", f"--bin={a.bin}",
                 f"--streams={a.streams}", f"--rate={a.rate}",
                 f"--client_cpus={a.client_cpus}", f"--warmup={a.warmup}",
                 f"--idle_s={a.idle_s}", f"--input_len={a.input_len}"]
        cmd = ["bash", os.path.join(ROOT, "scripts", "local_cluster.sh"),
               f"{w // 2}P{w // 2}D", "--no-build", f"--bin={a.bin}",
               f"--kv_cache_mib={kv_mib}",
               f"--coordinator_cpus={a.coordinator_cpus}",
               f"--worker_cpus={a.worker_cpus}",
               "--worker_flag=--engine=simulated", *kv_flags,
               "--worker_flag=--max_waiting_requests=100000",
               "--worker_flag=--max_queued_reservations=100000",
               f"--worker_flag=--profile={profile}",
               "--coordinator_flag=--max_waiting_requests=100000",
               "--coordinator_flag=--max_running_requests=100000",
               *[f"--coordinator_flag={f}" for f in a.coordinator_flag],
               "--"] + inner
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
    report(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
