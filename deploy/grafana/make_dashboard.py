#!/usr/bin/env python3
"""Writes deploy/grafana/baton.json, the Grafana dashboard for Baton's
Prometheus metrics (docs/metrics.md): latency percentiles (TTFT, TPOT, ITL,
end to end, queue), request rates by outcome, shed and migrated requests, load and KV blocks per worker,
KV transfer bytes and times per worker.

  python3 deploy/grafana/make_dashboard.py [--check]

--check compares instead of writing (exit 1 if the file differs): the
committed JSON is always this script's output. Every series is selected by
metric name; `instance` is the scraped process (Prometheus adds it).
"""

import argparse
import json
import os
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baton.json")
DS = {"type": "prometheus", "uid": "${datasource}"}


def quantiles(metric, by=""):
    group = f"le{', ' + by if by else ''}"
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[$__rate_interval])))",
         f"p{int(q * 100)}{' {{' + by + '}}' if by else ''}")
        for q in (0.5, 0.9, 0.99)
    ]


# (title, unit, [(expr, legend)])
ROWS = [
    ("Requests", [
        ("Time to first token", "s", quantiles("baton_time_to_first_token_seconds")),
        ("Time per output token", "s", quantiles("baton_time_per_output_token_seconds")),
        ("Inter-token latency", "s", quantiles("baton_inter_token_latency_seconds")),
        ("End-to-end latency", "s", quantiles("baton_e2e_request_latency_seconds")),
        ("Queue time (arrival to prefill)", "s", quantiles("baton_request_queue_time_seconds")),
        ("Requests ended, by outcome", "reqps",
         [("sum by (status) (rate(baton_requests_total[$__rate_interval]))", "{{status}}")]),
        ("Requests running", "short", [("sum(baton_requests_active)", "running"),
                                        ("sum(baton_requests_waiting)", "before the first token")]),
        ("Requests shed at admission (429)", "reqps",
         [("sum by (reason) (rate(baton_requests_shed_total[$__rate_interval]))", "{{reason}}")]),
        ("Requests moved after a fault", "reqps",
         [("sum(rate(baton_migrations_total[$__rate_interval]))", "migrated mid-stream"),
          ("sum(rate(baton_retries_total[$__rate_interval]))", "started over before the first token")]),
        ("Tokens", "short",
         [("sum(rate(baton_prompt_tokens_total[$__rate_interval]))", "prompt tokens/s"),
          ("sum(rate(baton_generation_tokens_total[$__rate_interval]))", "generated tokens/s")]),
        ("Healthy workers", "short",
         [("sum by (worker_role) (baton_workers_healthy)", "{{worker_role}}")]),
    ]),
    ("Workers", [
        ("Queue depth", "short",
         [("baton_worker_queued_requests", "{{instance}} queued"),
          ("baton_worker_running_requests", "{{instance}} running")]),
        ("Prompt tokens waiting for prefill", "short",
         [("baton_worker_queued_prefill_tokens", "{{instance}}")]),
        ("KV blocks in use", "percentunit",
         [("baton_worker_kv_blocks_used / (baton_worker_kv_blocks_used + baton_worker_kv_blocks_free)",
           "{{instance}}")]),
        ("KV blocks", "short",
         [("baton_worker_kv_blocks_used", "{{instance}} used"),
          ("baton_worker_kv_blocks_free", "{{instance}} free"),
          ("baton_worker_kv_blocks_cached", "{{instance}} cached")]),
        ("Prefix cache hit rate", "percentunit",
         [("rate(baton_worker_prefix_cache_hit_tokens_total[$__rate_interval]) / "
           "rate(baton_worker_prefix_cache_query_tokens_total[$__rate_interval])",
           "{{instance}}")]),
        ("Prefix cache evictions", "short",
         [("rate(baton_worker_kv_evictions_total[$__rate_interval])",
           "{{instance}} blocks/s")]),
        ("Prefill and decode rate", "short",
         [("rate(baton_worker_prefill_tokens_total[$__rate_interval])", "{{instance}} prefill tokens/s"),
          ("rate(baton_worker_decode_tokens_total[$__rate_interval])", "{{instance}} decode tokens/s")]),
        ("Worker streams ended, by phase and outcome", "reqps",
         [("sum by (instance, phase, status) (rate(baton_worker_requests_total[$__rate_interval]))",
           "{{instance}} {{phase}} {{status}}")]),
    ]),
    ("KV transfers", [
        ("KV bytes moved", "Bps",
         [("sum by (instance, direction) (rate(baton_worker_kv_transfer_bytes_total[$__rate_interval]))",
           "{{instance}} {{direction}}")]),
        ("KV transfer time", "s",
         quantiles("baton_worker_kv_transfer_seconds", "instance, direction")),
        ("KV transfers in flight", "short",
         [("baton_worker_kv_transfers_active", "{{instance}}")]),
    ]),
]


def dashboard():
    panels = []
    panel_id = 1
    y = 0
    for row_title, row in ROWS:
        panels.append({"type": "row", "title": row_title, "id": panel_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        panel_id += 1
        y += 1
        for i, (title, unit, targets) in enumerate(row):
            panels.append({
                "type": "timeseries",
                "title": title,
                "id": panel_id,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": [{"datasource": DS, "expr": expr, "legendFormat": legend,
                             "refId": chr(ord("A") + j)}
                            for j, (expr, legend) in enumerate(targets)],
            })
            panel_id += 1
        y += ((len(row) + 2) // 3) * 8
    return {
        "title": "Baton",
        "uid": "baton-overview",
        "description": "Baton's coordinator and workers (docs/metrics.md); made by deploy/grafana/make_dashboard.py",
        "tags": ["baton", "llm", "inference"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
    if args.check:
        with open(OUT) as f:
            if f.read() != text:
                print(f"{OUT} differs from make_dashboard.py's output: rerun it", file=sys.stderr)
                return 1
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
