#!/usr/bin/env python3
"""Tests of scripts/step_costs.py on traces whose every figure is known."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_costs  # noqa: E402

# Prefill: 1 ms a token; decode: 2 ms a step + 1 ms a sequence.
PROFILE = {"prefill": {"c0": 0.0, "c1": 0.001, "c2": 0.0},
           "decode": {"c0": 0.002, "c1": 0.0, "c2": 0.001}}


def step(start, seconds, items):
    return {"start": start, "seconds": seconds, "ok": True, "items": items}


class StepCostsTest(unittest.TestCase):
    def test_charges_pieces_and_decodes_as_the_simulator_does(self):
        c = PROFILE["prefill"]
        pre, dec, kind = step_costs.charged(
            dict(PROFILE, prefill=dict(c, c2=1e-6)),
            [[16, 100, 0], [300, 1, 1], [0, 50, 1]])
        # Pieces (16, 100) and (0, 50): 150 tokens, 116² - 16² + 50² squares.
        self.assertAlmostEqual(pre, 0.150 + 1e-6 * (116 ** 2 - 16 ** 2 + 50 ** 2))
        self.assertAlmostEqual(dec, 0.003)
        self.assertEqual(kind, "mixed")
        # As StepWork: one token after the first position is a decode, a
        # chunk that does not sample too; a one-token prompt is a piece.
        self.assertEqual(step_costs.charged(PROFILE, [[5, 1, 0]])[2], "decode")
        self.assertEqual(step_costs.charged(PROFILE, [[0, 1, 1]])[2], "prefill")

    def test_groups_steps_by_kind_and_by_what_the_other_worker_did(self):
        # Worker 0 prefills 100 tokens (0.1 s charged) in 0.12 s, then
        # decodes two sequences (4 ms charged) in 5 ms after a 1 ms gap;
        # worker 1 decodes one sequence (3 ms charged) in 6 ms at t = 0.057,
        # beside the prefill, and in 3 ms at t = 1, alone.
        workers = [
            [step(0.0, 0.12, [[0, 100, 1]]),
             step(0.121, 0.005, [[100, 1, 1], [200, 1, 1]])],
            [step(0.057, 0.006, [[10, 1, 1]]), step(1.0, 0.003, [[11, 1, 1]])],
        ]
        rows = {(r["kind"], r["neighbour"]): r
                for r in step_costs.table(PROFILE, workers, busy_gap_s=0.02)}
        prefill = rows[("prefill", "decoding")]
        self.assertEqual(prefill["steps"], 1)
        # Its whole time includes the 1 ms gap before the worker's next step.
        self.assertAlmostEqual(prefill["whole_s"], 0.121)
        self.assertAlmostEqual(prefill["ratio"], 1.21)
        self.assertAlmostEqual(rows[("decode", "idle")]["ratio"],
                               (0.005 + 0.003) / (0.004 + 0.003), places=3)
        self.assertAlmostEqual(rows[("decode", "prefilling")]["ratio"], 2.0)
        self.assertEqual(rows[("all", "any")]["steps"], 4)
        # No neighbor_slowdown in the profile: both charges agree.
        self.assertEqual(rows[("all", "any")]["neighbours_ratio"],
                         rows[("all", "any")]["ratio"])

    def test_decode_batch_factors_as_the_engine_applies_them(self):
        profile = dict(PROFILE, decode_batch_factors=[[1, 1.1], [3, 0.9]])
        self.assertAlmostEqual(step_costs.batch_factor(profile, 2), 1.0)
        self.assertAlmostEqual(step_costs.batch_factor(profile, 8), 0.9)
        self.assertEqual(step_costs.batch_factor(PROFILE, 8), 1.0)
        # Two decodes: (2 + 2) ms by the fit, times 1.0 at batch 2.
        self.assertAlmostEqual(
            step_costs.charged(profile, [[5, 1, 1], [9, 1, 1]])[1], 0.004)
        self.assertAlmostEqual(
            step_costs.charged(profile, [[5, 1, 1]])[1], 0.003 * 1.1)

    def test_decode_steps_by_batch(self):
        # Worker 1 decodes one sequence, then two, then three (charged 3, 4
        # and 5 ms) in 3, 5 and 5 ms, beside an idle worker 0.
        workers = [
            [step(10.0, 0.1, [[0, 100, 1]])],
            [step(0.0, 0.003, [[10, 1, 1]]),
             step(0.1, 0.005, [[11, 1, 1], [20, 1, 1]]),
             step(0.2, 0.005, [[12, 1, 1], [21, 1, 1], [30, 1, 1]])],
        ]
        rows = {(r["kind"], r["neighbour"]): r
                for r in step_costs.table(PROFILE, workers, 0.02, by_batch=2)}
        self.assertAlmostEqual(rows[("decode x1", "idle")]["ratio"], 1.0)
        self.assertAlmostEqual(rows[("decode x2+", "idle")]["ratio"],
                               0.010 / 0.009, places=3)
        self.assertEqual(rows[("decode x2+", "idle")]["steps"], 2)
        self.assertNotIn(("decode", "idle"), rows)
        self.assertEqual(rows[("prefill", "idle")]["steps"], 1)

    def test_busy_neighbours_add_the_profiles_slowdown_to_the_charge(self):
        workers = [
            [step(0.0, 0.12, [[0, 100, 1]]),
             step(0.121, 0.005, [[100, 1, 1], [200, 1, 1]])],
            [step(0.057, 0.006, [[10, 1, 1]]), step(1.0, 0.003, [[11, 1, 1]])],
        ]
        profile = dict(PROFILE,
                       neighbor_slowdown={"prefill": 0.1, "decode": 0.5})
        rows = {(r["kind"], r["neighbour"]): r
                for r in step_costs.table(profile, workers, 0.02)}
        # The prefill (beside a decode) is charged 0.1 * 1.1, the decode
        # beside it 0.003 * 1.5; the two steps with an idle neighbour as
        # before.
        prefill = rows[("prefill", "decoding")]
        self.assertAlmostEqual(prefill["neighbours_ratio"], 0.121 / 0.11,
                               places=3)
        self.assertAlmostEqual(rows[("all", "any")]["neighbours_ratio"],
                               0.135 / (0.11 + 0.004 + 0.0045 + 0.003),
                               places=3)
        # Two decode-only steps side by side are charged as if alone; a
        # mixed step beside a decode is slower by the prefill fraction,
        # whole, and that decode beside it by the decode fraction.
        pair = [[step(2.0, 0.01, [[50, 1, 1]]),
                 step(3.0, 0.2, [[0, 100, 1], [60, 1, 1]])],
                [step(1.996, 0.01, [[70, 1, 1]]),
                 step(3.09, 0.02, [[71, 1, 1]])]]
        rows = {(r["kind"], r["neighbour"]): r
                for r in step_costs.table(profile, pair, 0.02)}
        self.assertAlmostEqual(rows[("decode", "decoding")]["neighbours_ratio"],
                               (0.01 + 0.01) / (2 * 0.003), places=3)
        self.assertAlmostEqual(rows[("mixed", "decoding")]["neighbours_ratio"],
                               0.2 / ((0.1 + 0.003) * 1.1), places=3)
        self.assertAlmostEqual(
            rows[("decode", "prefilling")]["neighbours_ratio"],
            0.02 / (0.003 * 1.5), places=3)
        # One number is both fractions.
        self.assertEqual(step_costs.slowdown({"neighbor_slowdown": 0.2}),
                         (0.2, 0.2))
        self.assertEqual(step_costs.slowdown({}), (0, 0))


if __name__ == "__main__":
    unittest.main()
