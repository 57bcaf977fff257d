#!/usr/bin/env bash
# perf/ab_bench.sh — the four core benchmarks of two builds side by side, in one sitting,
# alternating A and B so drift on the machine hits both alike: ipc_bench, engine_bench
# (stories15M, 2 threads), sched_bench and sim_bench (the Azure conversation trace through
# the SAME policy file for both, A's token-budget.policy, so only the code differs).
#
#   perf/ab_bench.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]     e.g. /tmp/base/build build 3
#
# A_BUILD_DIR is usually a build of an older commit:
#   git worktree add /tmp/base f927083 && make -C /tmp/base -j2
# Prints one line per figure: median of A, median of B, B/A, and each side's spread.
set -euo pipefail
A=${1:?usage: perf/ab_bench.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]}
B=${2:?usage: perf/ab_bench.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]}
ROUNDS=${3:-3}
SHARED=${RINGLM_SHARED:-../shared}
A_SRC=$(cd "$A/.." && pwd)
POLICY="$A_SRC/sim/policies/token-budget.policy"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run_side() { # side build round
    local s=$1 b=$2 r=$3
    "$b/perf/ipc_bench" --json >"$out/$s.ipc.$r.json" 2>/dev/null
    "$b/perf/engine_bench" --model synthetic:stories15M:1 --threads 2 --json >"$out/$s.eng.$r.json" 2>/dev/null
    "$b/perf/sched_bench" --json >"$out/$s.sched.$r.json" 2>/dev/null
    RINGLM_SHARED=$SHARED "$b/perf/sim_bench" --json --policy "$POLICY" >"$out/$s.sim.$r.json" 2>/dev/null
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    run_side A "$A" "$r"
    run_side B "$B" "$r"
done

python3 - "$out" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(side, kind):
    return [json.load(open(f"{out}/{side}.{kind}.{r}.json")) for r in range(1, rounds + 1)]
figs = [
    ("ipc", "shm round trip p50 (ns)", lambda j: j["shm_rtt_ns"]["p50"], "lower"),
    ("ipc", "shm round trip p99 (ns)", lambda j: j["shm_rtt_ns"]["p99"], "lower"),
    ("ipc", "uds / shm p50", lambda j: j["uds_over_shm_p50"], "higher"),
    ("ipc", "sleeping round trip p50 (ns)", lambda j: j["shm_sleep_rtt_ns"]["p50"], "lower"),
    ("ipc", "token events/s", lambda j: j["events_per_s"], "higher"),
    ("eng", "decode tok/s, 1 seq", lambda j: j["decode_tok_s"]["1"], "higher"),
    ("eng", "decode tok/s, 8 seqs", lambda j: j["decode_tok_s"]["8"], "higher"),
    ("eng", "decode tok/s, 32 seqs", lambda j: j["decode_tok_s"]["32"], "higher"),
    ("eng", "prefill tok/s", lambda j: j["prefill_tok_s"], "higher"),
    ("sched", "step p50 (us), 256 run / 10k wait", lambda j: j["step_us"]["p50"], "lower"),
    ("sched", "step p99 (us), 256 run / 10k wait", lambda j: j["step_us"]["p99"], "lower"),
    ("sim", "Azure conv trace wall (s)", lambda j: j["wall_s"], "lower"),
]
print(f"{'figure':40s} {'A median':>12s} {'B median':>12s} {'B/A':>7s}   A spread / B spread")
for kind, name, f, better in figs:
    try:
        a = [f(j) for j in load("A", kind)]
        b = [f(j) for j in load("B", kind)]
    except (KeyError, FileNotFoundError, json.JSONDecodeError) as e:
        print(f"{name:40s} (missing: {e})")
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:40s} {ma:12.4g} {mb:12.4g} {mb / ma if ma else float('nan'):7.3f}   "
          f"{min(a):.4g}-{max(a):.4g} / {min(b):.4g}-{max(b):.4g}  ({better} is better)")
EOF
