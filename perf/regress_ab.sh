#!/usr/bin/env bash
# perf/regress_ab.sh — "no regression elsewhere": engine_bench, serve_bench and prefix_bench
# of two builds side by side in one sitting, interleaved (A B, then B A, ... each round),
# so drift of the machine and other users' load fall on both alike. Each build runs its own
# benches and its own ringlmd (bin/ next to perf/); the benches' sources must take the same
# options (they are unchanged from 914c56c to today).
#
#   perf/regress_ab.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]     e.g. /tmp/base/build build 3
#
# A_BUILD_DIR is usually a build of an older commit:
#   git worktree add --detach /tmp/base 914c56c && make -C /tmp/base -j2 programs benches
# Prints one line per figure: the median of A's rounds, of B's, B/A, and each side's lowest
# and highest; the 1-minute load average before and after each bench run goes to stderr and
# to the summary (on a shared machine the ratio is what counts, not the figures).
# Sizes (environment): ENGINE_MODEL (synthetic:stories15M:1), THREADS (2), SERVE_CLIENTS
# (1,8), PREFIX_ROUNDS (1), PREFIX_PAIRS (2).
set -euo pipefail
A=${1:?usage: perf/regress_ab.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]}
B=${2:?usage: perf/regress_ab.sh A_BUILD_DIR B_BUILD_DIR [ROUNDS]}
ROUNDS=${3:-3}
MODEL=${ENGINE_MODEL:-synthetic:stories15M:1}
THREADS=${THREADS:-2}
SERVE_CLIENTS=${SERVE_CLIENTS:-1,8}
PREFIX_ROUNDS=${PREFIX_ROUNDS:-1}
PREFIX_PAIRS=${PREFIX_PAIRS:-2}
export RINGLM_SHARED=${RINGLM_SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
for b in "$A" "$B"; do
    for p in perf/engine_bench perf/serve_bench perf/prefix_bench bin/ringlmd; do
        [ -x "$b/$p" ] || { echo "regress_ab.sh: $b/$p not built" >&2; exit 1; }
    done
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load1() { cut -d' ' -f1 /proc/loadavg; }

bench() { # side build kind round
    local s=$1 b=$2 k=$3 r=$4 l0
    l0=$(load1)
    case $k in
    engine)
        "$b/perf/engine_bench" --model "$MODEL" --threads "$THREADS" --seqs 1,8,32 --repeats 3 \
            --no-naive --json >"$out/$s.$k.$r.json" 2>"$out/$s.$k.$r.err" ;;
    serve)
        "$b/perf/serve_bench" --model "$MODEL" --threads "$THREADS" --clients "$SERVE_CLIENTS" \
            --runs 1 --slices 1 --min-slice-ms 500 --connect-burst 0 --json \
            >"$out/$s.$k.$r.json" 2>"$out/$s.$k.$r.err" ;;
    prefix)
        "$b/perf/prefix_bench" --rounds "$PREFIX_ROUNDS" --tiers none --nosharing-pairs "$PREFIX_PAIRS" \
            --nosharing-side-by-side 0 --bin "$b/bin" --json >"$out/$s.$k.$r.json" 2>"$out/$s.$k.$r.err" ;;
    esac || { echo "regress_ab.sh: $s $k round $r failed:" >&2; tail -5 "$out/$s.$k.$r.err" >&2; exit 1; }
    echo "$s $k $r $l0 $(load1)" >>"$out/load"
    echo "round $r: $s $k done (load $l0 -> $(load1))" >&2
}

for r in $(seq 1 "$ROUNDS"); do
    for k in engine serve prefix; do
        if [ $((r % 2)) -eq 1 ]; then
            bench A "$A" $k "$r"; bench B "$B" $k "$r"
        else
            bench B "$B" $k "$r"; bench A "$A" $k "$r"
        fi
    done
done

python3 - "$out" "$ROUNDS" "$SERVE_CLIENTS" <<'EOF'
import json, statistics, sys
out, rounds, clients = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")]
def load(side, kind):
    return [json.load(open(f"{out}/{side}.{kind}.{r}.json")) for r in range(1, rounds + 1)]
def size(j, n):
    return next(z for z in j["sizes"] if z["n"] == n)
figs = [
    ("engine", "engine decode tok/s, 1 seq", lambda j: j["decode_tok_s"]["1"]),
    ("engine", "engine decode tok/s, 8 seqs", lambda j: j["decode_tok_s"]["8"]),
    ("engine", "engine decode tok/s, 32 seqs", lambda j: j["decode_tok_s"]["32"]),
    ("engine", "engine prefill tok/s (256 tokens)", lambda j: j["prefill_tok_s"]),
]
for n in clients:
    for mode in ("engine", "sessions", "procs"):
        figs.append(("serve", f"serve {mode} tok/s, {n} seq", lambda j, n=n, m=mode: size(j, n)[m]["median"]))
figs += [
    ("prefix", "prefix TTFT p50 ms, cache on", lambda j: j["ttft_p50_ms"]["on"]),
    ("prefix", "prefix TTFT p50 ms, cache off", lambda j: j["ttft_p50_ms"]["off"]),
    ("prefix", "prefix prefill saved (share)", lambda j: j["prefill_saved"]),
    ("prefix", "prefix no-sharing on/off tok/s ratio", lambda j: j["nosharing_throughput_ratio"]),
]
print(f"{'figure':40s} {'A median':>10s} {'B median':>10s} {'B/A':>7s}   A [lo, hi] / B [lo, hi]")
for kind, name, f in figs:
    a = [f(j) for j in load("A", kind)]
    b = [f(j) for j in load("B", kind)]
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = mb / ma if ma else float("nan")
    print(f"{name:40s} {ma:10.2f} {mb:10.2f} {ratio:7.3f}   [{min(a):.2f}, {max(a):.2f}] / [{min(b):.2f}, {max(b):.2f}]")
loads = [l.split() for l in open(f"{out}/load")]
for side in ("A", "B"):
    v = [float(x) for l in loads if l[0] == side for x in l[3:5]]
    print(f"1-minute load during {side}'s runs: {min(v):.2f} to {max(v):.2f} (mean {statistics.mean(v):.2f}, {len(v)} readings)")
EOF
