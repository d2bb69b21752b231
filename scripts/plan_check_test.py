#!/usr/bin/env python3
"""Tests of scripts/plan_check.py with the real `baton-bench plan`.

    scripts/plan_check_test.py BIN_DIR

The sweeps are result files with chosen per-request records, so the measured
goodputs are known exactly; the plan's pick comes from baton-bench plan on
their schedule, and is the same whichever shape the records favour, so one
of two otherwise equal sweeps must be judged right and the other wrong.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")
PROFILE = os.path.join(ROOT, "bench", "sim", "profiles",
                       "cpu-smollm2-135m-1thread-measured.json")
SLO = "ttft:1000 tpot:50"


def result(good):
    """Ten requests, one a second, the first `good` within SLO."""
    dist = {"count": 10, "mean": 1.0, "median": 1.0, "std": 0.0, "min": 1.0,
            "max": 1.0, "p90": 1.0, "p99": 1.0}
    requests = []
    for i in range(10):
        ok = i < good
        requests.append({
            "index": i, "sent": True, "success": True, "send_time_s": float(i),
            "prompt_tokens": 64, "output_tokens": 8, "expected_output_len": 8,
            "ttft_ms": 200.0 if ok else 5000.0, "tpot_ms": 20.0,
        })
    return {
        "num_requests": 10, "completed": 10, "failed": 0, "aborted": 0,
        "not_sent": 0, "duration_s": 10.0, "request_throughput": 1.0,
        "output_throughput": 8.0, "good_requests": good,
        "request_goodput": good / 10.0, "ttft_ms": dist, "tpot_ms": dist,
        "itl_ms": dist, "e2el_ms": dist, "requests": requests,
    }


def run(*args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "plan_check.py"),
         f"--bin={BIN}", *args], capture_output=True, text=True)


class PlanCheckTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def sweep(self, name, good_2c, good_1p1d):
        raw = os.path.join(self.dir.name, name, "raw")
        os.makedirs(raw)
        for shape, good in (("2C", good_2c), ("1P1D", good_1p1d)):
            with open(os.path.join(raw, f"{shape}-r1.json"), "w") as f:
                json.dump(result(good), f)
        return os.path.dirname(raw)

    def check(self, sweep):
        done = run(f"--sweep={sweep}", f"--profile={PROFILE}", f"--goodput={SLO}")
        self.assertIn(done.returncode, (0, 1), done.stderr)
        with open(os.path.join(sweep, "plan-check", "plan_check.json")) as f:
            rows = json.load(f)["rows"]
        self.assertEqual(len(rows), 1)
        self.assertTrue(os.path.isfile(os.path.join(sweep, "plan-check",
                                                    "plan_check.md")))
        return done.returncode, rows[0]

    def test_the_pick_is_judged_by_the_measured_goodputs(self):
        code_2c, row_2c = self.check(self.sweep("2c-wins", 10, 2))
        code_1p1d, row_1p1d = self.check(self.sweep("1p1d-wins", 2, 10))
        self.assertEqual(row_2c["measured_goodput"], {"2C": 1.0, "1P1D": 0.2})
        self.assertEqual(row_2c["measured_best"], "2C")
        self.assertEqual(row_1p1d["measured_best"], "1P1D")
        # Same schedule, same profile: the same pick and predictions.
        self.assertEqual(row_2c["pick"], row_1p1d["pick"])
        self.assertEqual(row_2c["predicted_goodput"], row_1p1d["predicted_goodput"])
        self.assertIn(row_2c["pick"], ("2C", "1P1D"))
        self.assertEqual(set(row_2c["predicted_goodput"]), {"2C", "1P1D"})
        self.assertEqual(row_2c["right"], row_2c["pick"] == "2C")
        self.assertEqual(row_1p1d["right"], row_1p1d["pick"] == "1P1D")
        self.assertNotEqual(row_2c["right"], row_1p1d["right"])
        self.assertEqual(code_2c, 0 if row_2c["right"] else 1)
        self.assertEqual(code_1p1d, 0 if row_1p1d["right"] else 1)

    def test_within_the_tolerance_of_the_best_is_right(self):
        code, row = self.check(self.sweep("close", 10, 9))
        self.assertTrue(row["right"])
        self.assertEqual(code, 0)

    def test_bad_input_names_the_problem(self):
        done = run(f"--sweep={self.dir.name}/none", f"--profile={PROFILE}")
        self.assertEqual(done.returncode, 2)
        self.assertIn("no folder", done.stderr)
        done = run(f"--sweep={self.dir.name}", f"--profile={PROFILE}",
                   "--goodput=p99:5")
        self.assertEqual(done.returncode, 2)
        self.assertIn("'p99:5' is not METRIC:MS", done.stderr)
        done = run(f"--sweep={self.dir.name}", "--profile=/nonexistent.json")
        self.assertEqual(done.returncode, 2)
        self.assertIn("no file /nonexistent.json", done.stderr)


if __name__ == "__main__":
    unittest.main()
