#!/usr/bin/env bash
# tune_bench.sh — how long `ringlm-sim --tune` takes on the full Azure conversation trace at three
# load levels (the goal: under two minutes on this machine).
#
# Each run: `ringlm-sim --trace AzureLLMInferenceTrace_conv.csv --policy
# sim/policies/token-budget.policy --tune default --tune-loads 1,2,3` on every CPU (the default
# --tune-jobs), timed wall and CPU (user + system); beside it, in the same loop, the baseline:
# one plain replay of the same trace at ×3 under the same policy, so the ratio (search wall /
# one replay's wall) says how many whole-trace simulations the search costs whatever the
# machine's load.  Runs alternate search, replay; medians over --runs.  The search is
# deterministic (the same candidates, simulations and answer every run); only the times move
# with what else the machine is doing, so the load average before and after is printed: rerun
# on a quiet machine for figures to keep.
# Goal: median search wall < 120 s.  Exit 0 when met, 1 when not (or a run failed), 77 when
# the trace or the program is missing.
# Usage: B=build perf/tune_bench.sh [--runs N (3)] [--loads 1,2,3] [--jobs N] [--json]
#        (env RINGLM_SHARED: where traces/ is, default ../shared)
set -u
cd "$(dirname "$0")/.." || exit 2
B=${B:-build}
SHARED=${RINGLM_SHARED:-../shared}
RUNS=3 LOADS=1,2,3 JOBS=() JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --loads) LOADS=$2; shift 2 ;;
    --jobs) JOBS=(--tune-jobs "$2"); shift 2 ;;
    --json) JSON=1; shift ;;
    *) echo "usage: $0 [--runs N] [--loads 1,2,3] [--jobs N] [--json]" >&2; exit 2 ;;
    esac
done
SIM=$B/bin/ringlm-sim
TRACE=$SHARED/traces/AzureLLMInferenceTrace_conv.csv
POLICY=sim/policies/token-budget.policy
for f in "$SIM" "$TRACE" "$POLICY"; do
    [ -e "$f" ] || { echo "tune_bench: $f missing (make; RINGLM_SHARED)"; exit 77; }
done
case "$RUNS" in '' | *[!0-9]* | 0) echo "tune_bench: --runs wants a positive integer" >&2; exit 2 ;; esac
TMP=$(mktemp -d /tmp/ringlm-tune-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
top=${LOADS##*,}

# timed OUT ERR CMD...: CMD's stdout to OUT, stderr to ERR; prints its seconds of wall and of
# CPU (user + system of the processes it waited for), "WALL CPU"
timed() {
    local out=$1 err=$2 me=$BASHPID t0 t1 c0 c1
    shift 2
    c0=$(awk '{print $16 + $17}' /proc/$me/stat)   # cutime + cstime of this (sub)shell, in ticks
    t0=$(date +%s.%N)
    "$@" > "$out" 2> "$err" || return 1
    t1=$(date +%s.%N)
    c1=$(awk '{print $16 + $17}' /proc/$me/stat)
    awk -v a="$t0" -v b="$t1" -v c="$c0" -v d="$c1" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.2f %.2f\n", b - a, (d - c) / hz }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M')
: > "$TMP/tune"
: > "$TMP/replay"
for i in $(seq 1 "$RUNS"); do
    r=$(timed "$TMP/out.$i" "$TMP/err.$i" "$SIM" --trace "$TRACE" --policy "$POLICY" --tune default \
              --tune-loads "$LOADS" "${JOBS[@]}" --tune-out "$TMP/tuned.policy") \
        || { echo "tune_bench: the search failed (run $i):" >&2; cat "$TMP/err.$i" >&2; exit 1; }
    echo "$r" >> "$TMP/tune"
    r=$(timed /dev/null "$TMP/rerr" "$SIM" --trace "$TRACE" --rate "$top" --policy "$POLICY" --json) \
        || { echo "tune_bench: the replay failed:" >&2; cat "$TMP/rerr" >&2; exit 1; }
    echo "$r" >> "$TMP/replay"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
tw=$(cut -d' ' -f1 "$TMP/tune" | median) tc=$(cut -d' ' -f2 "$TMP/tune" | median)
rw=$(cut -d' ' -f1 "$TMP/replay" | median)
tmin=$(cut -d' ' -f1 "$TMP/tune" | sort -g | head -1) tmax=$(cut -d' ' -f1 "$TMP/tune" | sort -g | tail -1)
line=$(grep -m1 'simulations on' "$TMP/out.1")
sims=$(sed -n 's/.* \([0-9][0-9]*\) simulations on \([0-9][0-9]*\) threads.*/\1/p' <<<"$line")
threads=$(sed -n 's/.* simulations on \([0-9][0-9]*\) threads.*/\1/p' <<<"$line")
# the answer (its hash) and the search's size are the same every run: only the times may differ
hash_of() { sed -n 's/^best policy written to .*(hash \([0-9a-f]*\))$/\1/p' "$1"; }
best=$(hash_of "$TMP/out.1")
same=1
for i in $(seq 2 "$RUNS"); do
    [ "$(hash_of "$TMP/out.$i")" = "$best" ] && grep -q " $sims simulations on" "$TMP/out.$i" || same=0
done
met=$(awk -v w="$tw" 'BEGIN { print (w < 120) ? 1 : 0 }')
machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
if [ "$JSON" = 1 ]; then
    jq -n --arg machine "${machine:-unknown}" --argjson cpus "$(nproc)" --arg loads "$LOADS" --argjson runs "$RUNS" \
        --argjson wall "$tw" --argjson wmin "$tmin" --argjson wmax "$tmax" --argjson cpu "$tc" --argjson replay "$rw" \
        --argjson sims "${sims:-0}" --argjson threads "${threads:-0}" --arg best "$best" --argjson same "$same" \
        --arg lb "$load_before" --arg la "$load_after" --argjson met "$met" --arg started "$started" \
        '{machine: $machine, cpus: $cpus, trace: "AzureLLMInferenceTrace_conv.csv", loads: $loads, runs: $runs,
          tune_wall_s: {median: $wall, min: $wmin, max: $wmax}, tune_cpu_s: $cpu, simulations: $sims, threads: $threads,
          replay_wall_s: $replay, ratio: ($wall / $replay), best_hash: $best, same_answer_every_run: ($same == 1),
          started_utc: $started, loadavg_before: $lb, loadavg_after: $la, goal_s: 120, met: ($met == 1)}'
else
    echo "machine: ${machine:-unknown}, $(nproc) CPUs; $started–$(date -u '+%H:%M') UTC; load average before $load_before, after $load_after"
    echo "ringlm-sim --trace AzureLLMInferenceTrace_conv.csv --policy $POLICY --tune default --tune-loads $LOADS ${JOBS[*]}"
    echo
    echo "| what | median wall s [min, max] | CPU s | simulations | threads | best policy |"
    echo "| --- | --- | --- | --- | --- | --- |"
    printf '| --tune, %s runs | %.1f [%.1f, %.1f] | %.1f | %s | %s | %s%s |\n' "$RUNS" "$tw" "$tmin" "$tmax" "$tc" \
        "${sims:-?}" "${threads:-?}" "$best" "$([ "$same" = 1 ] && echo ", the same every run" || echo ", DIFFERENT between runs")"
    printf '| baseline: one replay at ×%s | %.2f | | 1 | 1 | |\n' "$top" "$rw"
    echo
    awk -v w="$tw" -v r="$rw" 'BEGIN { printf "the search costs %.1f whole-trace replays; goal: under 120 s wall: %s\n", w / r, (w < 120 ? "met" : "NOT met") }'
fi
[ "$same" = 1 ] || exit 1
[ "$met" = 1 ]
