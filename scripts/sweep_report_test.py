#!/usr/bin/env python3
"""Tests of scripts/sweep_report.py: the recommendation, capacity, CSV and bad input.

Inputs are result files in the baton-bench --save-result schema with chosen
numbers, so every expected figure below is known exactly.
"""

import csv
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_report  # noqa: E402


def result(sent, good, duration_s, ttft_p99=100.0, sends=()):
    dist = {"count": sent, "mean": 1.0, "median": 1.0, "std": 0.0, "min": 1.0,
            "max": 1.0, "p90": 1.0, "p99": 1.0}
    return {
        "num_requests": sent, "completed": sent, "failed": 0, "aborted": 0,
        "not_sent": 0, "duration_s": duration_s,
        "request_throughput": sent / duration_s, "output_throughput": 32 * sent / duration_s,
        "good_requests": good, "request_goodput": good / duration_s,
        "slo": {"ttft_ms": 2000.0, "tpot_ms": 100.0, "e2el_ms": None},
        "ttft_ms": dict(dist, p99=ttft_p99), "tpot_ms": dist, "itl_ms": dist,
        "e2el_ms": dist, "bench_client": {"cpu_percent_of_one_core": 3.0},
        "requests": [{"sent": True, "send_time_s": t} for t in sends],
    }


class SweepReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = self.dir.name
        os.makedirs(os.path.join(self.out, "raw"))

    def tearDown(self):
        self.dir.cleanup()

    def put(self, name, content):
        with open(os.path.join(self.out, "raw", name), "w", encoding="utf-8") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))

    def run_report(self, *extra):
        return sweep_report.main([self.out, "--no-plots", "--shapes=2C,1P1D",
                                  "--total_threads=2", *extra])

    def summary(self):
        with open(os.path.join(self.out, "summary.md"), encoding="utf-8") as f:
            return f.read()

    def test_recommends_the_highest_goodput_at_each_rate(self):
        # Rate 1: both serve everything (tie). Rate 4: 1P1D keeps 18 of 20
        # within the SLO, 2C only 10. Rate inf: 2C 12 good, 1P1D 8.
        self.put("2C-r1.json", result(20, 20, 20.0))
        self.put("1P1D-r1.json", result(20, 20, 20.2))
        # 5 sends over 2 s: 4 gaps, an offered rate of 2 req/s.
        self.put("2C-r4.json", result(20, 10, 5.0, sends=[1.0, 1.5, 2.0, 2.5, 3.0]))
        self.put("1P1D-r4.json", result(20, 18, 5.0))
        self.put("2C-rinf.json", result(20, 12, 4.0))
        self.put("1P1D-rinf.json", result(20, 8, 4.0))
        self.put("notes.txt", "ignored: not a point file")
        self.assertEqual(self.run_report(), 0)
        text = self.summary()
        self.assertIn("| 1 | **2C** (tie: 1P1D within 5%) | 1.000 | 100% |", text)
        self.assertIn("| 4 | **1P1D** | 3.600 | 90% |", text)
        self.assertIn("| inf | **2C** | 3.000 | 60% |", text)
        # Capacity at 90% attainment: 1P1D up to 4 req/s, 2C only 1 req/s;
        # the shape with the higher capacity is listed first.
        self.assertLess(text.index("**1P1D** meets the SLOs for ≥ 90% of requests up to 4 req/s"),
                        text.index("**2C** meets the SLOs for ≥ 90% of requests up to 1 req/s"))
        with open(os.path.join(self.out, "points.csv"), encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([(r["shape"], r["rate"]) for r in rows],
                         [("2C", "1"), ("2C", "4"), ("2C", "inf"),
                          ("1P1D", "1"), ("1P1D", "4"), ("1P1D", "inf")])
        self.assertEqual(rows[4]["good_requests"], "18")
        self.assertAlmostEqual(float(rows[4]["slo_attainment"]), 0.9)
        self.assertAlmostEqual(float(rows[4]["goodput"]), 3.6)
        self.assertAlmostEqual(float(rows[1]["offered_rate"]), 2.0)
        self.assertEqual(rows[0]["offered_rate"], "")
        self.assertIn("| 2C | 4 (2.00) | 20 / 20 |", text)

    def test_equal_goodput_prefers_lower_p99_ttft(self):
        self.put("2C-r2.json", result(10, 10, 5.0, ttft_p99=900.0))
        self.put("1P1D-r2.json", result(10, 10, 5.0, ttft_p99=300.0))
        self.assertEqual(self.run_report(), 0)
        self.assertIn("| 2 | **1P1D** (tie: 2C within 5%) |", self.summary())

    def test_shape_that_never_meets_the_target_says_so(self):
        self.put("2C-r2.json", result(10, 5, 5.0))
        self.assertEqual(self.run_report(), 0)
        self.assertIn("**2C** meets the SLOs for ≥ 90% of requests up to none of the rates tried.",
                      self.summary())

    def test_bad_input_is_an_error_naming_the_file(self):
        self.put("2C-r2.json", "{ not json")
        self.assertEqual(self.run_report(), 1)
        with self.assertRaisesRegex(sweep_report.ReportError, "2C-r2.json: not a baton-bench"):
            sweep_report.load_points(self.out)

    def test_result_without_slo_is_an_error(self):
        no_slo = result(10, 10, 5.0)
        no_slo["request_goodput"] = None
        self.put("2C-r2.json", no_slo)
        with self.assertRaisesRegex(sweep_report.ReportError, "had no --goodput SLO"):
            sweep_report.load_points(self.out)

    def test_empty_folder_is_an_error(self):
        with self.assertRaisesRegex(sweep_report.ReportError, "no SHAPE-rRATE.json results"):
            sweep_report.load_points(self.out)
        self.assertEqual(sweep_report.main([self.dir.name + "/missing"]), 1)

    def test_other_slo_is_judged_from_the_request_records(self):
        # Two points with per-request records: 2C has fast first tokens and
        # slow TPOT, 1P1D the opposite.
        def records(ttft, tpot):
            return [{"success": True, "sent": True, "send_time_s": float(i),
                     "ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": ttft + 31 * tpot}
                    for i in range(10)]
        colocated = result(10, 10, 5.0)
        colocated["requests"] = records(900.0, 30.0)
        split = result(10, 10, 5.0)
        split["requests"] = records(1100.0, 8.0)
        split["requests"][0]["success"] = False  # a failed request is never good
        self.put("2C-r2.json", colocated)
        self.put("1P1D-r2.json", split)
        report = os.path.join(self.out, "strict")
        self.assertEqual(self.run_report("--goodput=ttft:2500 tpot:20",
                                         f"--report_dir={report}"), 0)
        with open(os.path.join(report, "summary.md"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("SLO: TTFT ≤ 2500 ms, TPOT ≤ 20 ms", text)
        self.assertIn("| 2 | **1P1D** | 1.800 | 90% |", text)
        self.assertIn("Raw baton-bench results: `../raw/`", text)
        self.assertEqual(self.run_report("--goodput=ttft:1000", f"--report_dir={report}"), 0)
        with open(os.path.join(report, "summary.md"), encoding="utf-8") as f:
            self.assertIn("| 2 | **2C** | 2.000 | 100% |", f.read())

    def test_bad_goodput_is_rejected(self):
        self.put("2C-r2.json", result(10, 10, 5.0))
        for bad in ("ttft", "latency:5", "tpot:-1", "tpot:x", ""):
            self.assertEqual(self.run_report(f"--goodput={bad}"), 2, bad)

    def test_attainment_outside_range_is_rejected(self):
        self.put("2C-r2.json", result(10, 10, 5.0))
        self.assertEqual(self.run_report("--attainment=1.5"), 2)


if __name__ == "__main__":
    unittest.main()
