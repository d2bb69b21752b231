#!/usr/bin/env bash
# The small fidelity case of scripts/fidelity.py, with the binaries in
# BIN_DIR: bad options fail before any cluster starts; then a quick profile
# of this host's 1P1D cluster, its saturation throughput and a point at half
# of it, each measured and simulated from the same requests. The fidelity
# bounds are timing goals for a quiet machine (docs/planning.md's table), so
# this checks the pipeline, not them: every request completed, baton-sim
# replayed exactly the requests and token counts that were sent, and the
# simulated saturation is within a factor of 3 of the measured one (a unit
# or model error; the host's speed does not move that much between the
# profile and the cluster). The profile's own fit limit is lifted for the
# same reason: a slowed host makes noisy samples, not a broken pipeline.
#
#   scripts/fidelity_test.sh BIN_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: fidelity_test.sh BIN_DIR}"
PYTHON=python3  # fidelity.py needs the standard library only
OUT="$(mktemp -d /tmp/fidelity-test.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
fail() { echo "fidelity_test: FAIL: $*" >&2; exit 1; }
FIDELITY=("$PYTHON" "$ROOT/scripts/fidelity.py" --bin="$BIN")

# shellcheck source=scripts/test_lib.sh
source "$ROOT/scripts/test_lib.sh"
bad() {  # want, options...
  expect_usage_error "$1" "$OUT/bad/profile.json" -- \
    "${FIDELITY[@]}" --out="$OUT/bad" "${@:2}"
}
bad "is not a fraction of capacity" --loads=1.5
bad "'p99' is not one of" --check=p99
bad "must be positive" --num_prompts=0
bad "must be a positive fraction" --profile_max_error=0
echo "fidelity_test: bad options rejected" >&2

"${FIDELITY[@]}" --quick_profile --shapes=1P1D --loads=0.5 --seeds=0 \
  --num_prompts=12 --saturation_prompts=16 --input_len=192 --output_len=48 \
  --goodput="ttft:4000 tpot:60" --profile_max_error=1 --out="$OUT/run" ||
  fail "fidelity.py exited $?"
for f in profile.json points-1P1D.json fidelity.md fidelity.json \
  steps-1P1D.md; do
  [[ -s "$OUT/run/$f" ]] || fail "missing $f"
done
grep -q "| 1P1D | 50% |" "$OUT/run/fidelity.md" || fail "no 1P1D row"
# The burst's steps gave the host's speed, and baton-sim ran at it.
grep -Eq "^\| 1P1D \|.*\| [0-9.]+ \| [0-9.]+ \([-+][0-9.]+%\) \|$" \
  "$OUT/run/fidelity.md" || fail "no host speed in the saturation row"
grep -q "| prefill |" "$OUT/run/steps-1P1D.md" || fail "no prefill steps traced"
# The split cluster's profile set its fits' level from the neighbour run's
# baseline.
grep -q "scaled by" "$OUT/run/profile.json" || fail "profile fits not scaled"
# The decode fit carries its error at each batch it sampled.
grep -q "decode_batch_factors" "$OUT/run/profile.json" ||
  fail "no decode_batch_factors in the profile"
"$PYTHON" - "$OUT/run" <<'EOF' || fail "the replay check above"
import glob, json, os, sys
run = sys.argv[1]
sims = sorted(p for p in glob.glob(os.path.join(run, "raw", "*-sim.json"))
              if not p.endswith("-traced-sim.json"))
if not os.path.exists(os.path.join(run, "raw",
                                   "1P1D-saturation-traced-sim.json")):
    sys.exit("no simulation at the burst's speed")
if len(sims) != 2:
    sys.exit(f"expected 2 simulated points, found {len(sims)}")
for sim_path in sims:
    with open(sim_path) as f:
        sim = json.load(f)
    with open(sim_path.replace("-sim.json", ".json")) as f:
        measured = json.load(f)
    name = os.path.basename(sim_path)
    sent = [r for r in measured["requests"] if r["sent"]]
    if measured["completed"] != measured["num_requests"]:
        sys.exit(f"{name}: {measured['completed']} of "
                 f"{measured['num_requests']} requests completed")
    for key, want in (("num_requests", len(sent)),
                      ("completed", len(sent)),
                      ("total_input_tokens", measured["total_input_tokens"]),
                      ("total_output_tokens", measured["total_output_tokens"])):
        if sim[key] != want:
            sys.exit(f"{name}: simulated {key} {sim[key]}, sent {want}")
with open(os.path.join(run, "fidelity.json")) as f:
    sat = [r for r in json.load(f) if r["load"] == "saturation"][0]
ratio = sat["simulated"] / sat["measured"]
print(f"fidelity_test: saturation measured {sat['measured']:.3f} req/s, "
      f"simulated {sat['simulated']:.3f} (ratio {ratio:.2f})", file=sys.stderr)
if not 1 / 3 <= ratio <= 3:
    sys.exit(f"simulated saturation {ratio:.2f}x the measured one, "
             "outside [1/3, 3]")
EOF
echo "fidelity_test: passed" >&2
