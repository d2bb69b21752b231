#!/usr/bin/env python3
"""deploy/grafana/baton.json is make_dashboard.py's output, and every metric
and label its queries use is one the processes export: a coordinator and a
prefill and a decode worker (this tree's programs, on loopback, each with
--metrics_listen) serve one split request, and their /metrics are scraped.

  python3 tests/deploy/grafana_test.py BIN_DIR MODEL
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAFANA = os.path.join(ROOT, "deploy", "grafana")
BIN, MODEL = sys.argv[1], sys.argv[2]
# Labels Prometheus or PromQL add, not the processes.
OWN_LABELS = {"instance", "job", "le"}


def dashboard_queries(dashboard):
    """(expr, legend) of every target of every panel."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"], target.get("legendFormat", "")


def uses(expr, legend):
    """{metric: set of labels} an expression relies on: the metrics it names,
    with the labels of its `by (...)` clauses and of its legend."""
    labels = set(re.findall(r"\{\{(\w+)\}\}", legend))
    for clause in re.findall(r"by \(([^)]*)\)", expr):
        labels |= {l.strip() for l in clause.split(",") if l.strip()}
    return {m: labels - OWN_LABELS for m in re.findall(r"\b(baton_\w+)", expr)}


def exported(text):
    """{sample name: set of label names} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        names = set(re.findall(r"(\w+)=\"", m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(names)
    return out


def problems(dashboard, series):
    found = []
    for expr, legend in dashboard_queries(dashboard):
        for metric, labels in uses(expr, legend).items():
            if metric not in series:
                found.append(f"'{expr}': no process exports {metric}")
            elif not labels <= series[metric]:
                found.append(f"'{expr}': {metric} has no label {sorted(labels - series[metric])}")
    return found


class Process:
    """A child whose output lines (stdout and stderr) a thread collects."""

    def __init__(self, args):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(line)

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                lines = list(self.lines)
            for line in lines:
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.proc.args[0]} exited {self.proc.returncode}")
            time.sleep(0.05)
        raise AssertionError(f"{self.proc.args[0]} printed no '{pattern}' in {timeout} s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class GrafanaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(GRAFANA, "baton.json")) as f:
            cls.dashboard = json.load(f)
        cls.processes = []
        try:
            coordinator = cls.start([f"{BIN}/baton-coordinator", "--listen=127.0.0.1:0",
                                     "--control_listen=127.0.0.1:0", f"--model={MODEL}",
                                     "--metrics_listen=127.0.0.1:0"])
            m = coordinator.wait_for(r"listening on (\S+), control (\S+),")
            public, control = m.group(1), m.group(2)
            addresses = [coordinator.wait_for(r"metrics on (\S+)").group(1)]
            for role in ("prefill", "decode"):
                worker = cls.start([f"{BIN}/baton-worker", f"--role={role}", f"--model={MODEL}",
                                    f"--coordinator={control}", "--metrics_listen=127.0.0.1:0",
                                    f"--worker_id=grafana-{role}"])
                addresses.append(worker.wait_for(r"metrics on (\S+)").group(1))
                worker.wait_for(r"registered as")
            r = subprocess.run([f"{BIN}/baton", "generate", f"--server={public}",
                                "--prompt=Hello.", "--max_tokens=4"],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            cls.series = {}
            for address in addresses:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as response:
                    for name, labels in exported(response.read().decode()).items():
                        cls.series.setdefault(name, set()).update(labels)
        finally:
            for p in cls.processes:
                p.stop()

    @classmethod
    def start(cls, args):
        p = Process(args)
        cls.processes.append(p)
        return p

    def test_json_is_the_generators_output(self):
        r = subprocess.run([sys.executable, os.path.join(GRAFANA, "make_dashboard.py"), "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_every_query_uses_exported_metrics_and_labels(self):
        queries = list(dashboard_queries(self.dashboard))
        self.assertGreater(len(queries), 20)
        self.assertEqual(problems(self.dashboard, self.series), [])
        # Worker series came from the workers' own listeners.
        self.assertIn("baton_worker_kv_transfer_seconds_bucket", self.series)

    def test_the_check_can_fail(self):
        broken = json.loads(json.dumps(self.dashboard))
        target = broken["panels"][1]["targets"][0]
        target["expr"] = "sum by (model) (rate(baton_requests_totl[5m]))"
        found = problems(broken, self.series)
        self.assertTrue(any("no process exports baton_requests_totl" in p for p in found), found)
        target["expr"] = "sum by (model) (rate(baton_requests_total[5m]))"
        found = problems(broken, self.series)
        self.assertTrue(any("has no label ['model']" in p for p in found), found)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
