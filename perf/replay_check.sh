#!/usr/bin/env bash
# replay_check.sh — the simulator's policy comparison checked once on the real daemon (issue 15).
#
# The tuned policy and FCFS on a real ringlmd (stories260K, CPU), with `ringlm replay` of one
# minute of serving, at the load where the simulator says they differ most:
#   1. calibration: perf/calibrate on the model, now, on this machine (or --calibration FILE):
#      the bare engine's step grid; then a calibration run — ringlmd under the policy serves
#      another stretch of the trace (CAL_SECONDS, default 20 s, at ×CAL_LOAD, default 8, ending
#      where the checked window starts) — whose iteration log gives the serving loop's own step
#      model (ringlm-sim --iteration-log; --no-fit-run skips it: the grid alone)
#   2. the trace (Azure conversation by default) fitted into the model's 512-token context as
#      `ringlm replay --max-context 512` fits it (perf/clip_azure.sh)
#   3. simulator scan: for each load x in --loads, the window [START, START + 60·x) s of the
#      trace (one minute of serving at x; --seconds changes the minute) through ringlm-sim with that model, the policy and the
#      baseline side by side; the load with the largest goodput difference is chosen
#   4. real runs at that load: for each policy a fresh ringlmd serves the same window replayed
#      by `ringlm replay` (4 client processes) and writes its request and iteration logs
#   5. goodput at SLO of each real run from its request log with the simulator's definition
#      (requests finished within the class's TTFT and TPOT targets, per second of the run;
#      cancelled requests not counted), next to the simulator's predictions (grid model, and
#      the calibration run's fit), and the simulator again with the step model fitted from that
#      run's own iterations (what the prediction would have been had the model matched the
#      machine as it was during the run)
# The simulator is deterministic; the real runs are not, and a compile beside them moves the
# engine's speed by up to 2× — run it on a quiet machine for figures to keep.  The load average
# before and after is printed with the figures.
# Usage: B=build perf/replay_check.sh [--policy FILE] [--baseline FILE] [--trace conv|code]
#        [--start S (1200)] [--seconds N (60)] [--loads "2 4 8 12 16"] [--load X (skip the scan)]
#        [--calibration FILE] [--no-fit-run] [--threads N] [--out DIR]
#   env: RINGLM_SHARED (traces/, models/), MODEL, CLIENTS (4), MAX_BATCH_TOKENS (ringlmd's default
#   when unset: the policy's budget, plus the longest prompt under FCFS), DAEMON_CPUS / CLIENT_CPUS
#   (taskset lists, "none" = unpinned; default daemon on CPU 0, clients on the others)
# Exit 0 when the runs completed, 1 on a failure, 77 when the model, trace or programs are missing.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
SHARED=${RINGLM_SHARED:-../shared}
MODEL=${MODEL:-$SHARED/models/stories260K.bin}
POLICY=sim/policies/stories260K-cpu.policy BASE=sim/policies/fcfs.policy TRACE_NAME=conv
START=1200 SECONDS_REAL=60 LOADS="2 4 8 12 16" LOAD= CAL= THREADS=1 OUT= FIT_RUN=1
CAL_SECONDS=${CAL_SECONDS:-20} CAL_LOAD=${CAL_LOAD:-8}
CTX=512 KV=1024
# the engine's batch limit: ringlmd sizes it from the policy (its token budget; in continuous
# mode, FCFS, the budget plus the model's longest prompt, which FCFS runs whole); set
# MAX_BATCH_TOKENS only to override that
MAX_BATCH=()
[ -n "${MAX_BATCH_TOKENS:-}" ] && MAX_BATCH=(--max-batch-tokens "$MAX_BATCH_TOKENS")
while [ $# -gt 0 ]; do
    case "$1" in
    --policy) POLICY=$2; shift 2 ;; --baseline) BASE=$2; shift 2 ;; --trace) TRACE_NAME=$2; shift 2 ;;
    --start) START=$2; shift 2 ;; --seconds) SECONDS_REAL=$2; shift 2 ;; --loads) LOADS=$2; shift 2 ;;
    --load) LOAD=$2; shift 2 ;; --calibration) CAL=$2; shift 2 ;; --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;; --no-fit-run) FIT_RUN=0; shift ;;
    *) echo "replay_check: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
for p in "$B/bin/ringlmd" "$B/bin/ringlm" "$B/bin/ringlm-sim" "$B/perf/calibrate"; do
    [ -x "$p" ] || { echo "replay_check: $p not built (make)"; exit 77; }
done
TRACE=$SHARED/traces/AzureLLMInferenceTrace_$TRACE_NAME.csv
for f in "$MODEL" "$TRACE" "$POLICY" "$BASE"; do [ -f "$f" ] || { echo "replay_check: $f missing"; exit 77; }; done
command -v jq > /dev/null || { echo "replay_check: jq missing (scripts/install-deps.sh)"; exit 77; }
DIR=${OUT:-$(mktemp -d /tmp/ringlm-replay-check.XXXXXX)}
mkdir -p "$DIR"
load_avg() { sed 's/ [0-9]*\/.*//' /proc/loadavg; }
machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "machine: ${machine:-unknown}, $(nproc) CPUs; $(date -u '+%Y-%m-%d %H:%M UTC'); load average $(load_avg)"
echo "policy $POLICY vs $BASE; trace $TRACE_NAME clipped to $CTX tokens; model $(basename "$MODEL"), $THREADS thread(s)"

if [ -z "$CAL" ]; then
    CAL=$DIR/cal.json
    "$B/perf/calibrate" --model "$MODEL" --threads "$THREADS" --kv-blocks $KV --no-disk --reps 15 -o "$CAL" \
        > "$DIR/calibrate.out" 2>&1 || { cat "$DIR/calibrate.out"; exit 1; }
    echo "calibration: $(grep -E '^step model' "$DIR/calibrate.out")"
fi
perf/clip_azure.sh $CTX < "$TRACE" > "$DIR/trace.csv"

NCPU=$(nproc)
DAEMON_CPUS=${DAEMON_CPUS:-$( [ "$NCPU" -gt "$THREADS" ] && echo "0-$((THREADS - 1))" || echo none)}
CLIENT_CPUS=${CLIENT_CPUS:-$( [ "$DAEMON_CPUS" != none ] && echo "$THREADS-$((NCPU - 1))" || echo none)}
DPIN=() CPIN=() NUMA=()
if [ "$DAEMON_CPUS" != none ] && command -v taskset > /dev/null; then DPIN=(taskset -c "$DAEMON_CPUS"); NUMA=(--numa-node off); fi
if [ "$CLIENT_CPUS" != none ] && command -v taskset > /dev/null; then CPIN=(taskset -c "$CLIENT_CPUS"); fi
SOCK=$DIR/sock
DPID=
trap '[ -n "$DPID" ] && kill -TERM $DPID 2> /dev/null; wait $DPID 2> /dev/null' EXIT
# serve TAG POLICY: a fresh ringlmd under POLICY, one replay of [WSTART (default START), +WEND)
# of the trace at LOAD, stop; logs in $DIR/TAG-{requests,iterations}.jsonl
serve() {
    local tag=$1 pol=$2
    rm -f "$SOCK" "$DIR/$tag-requests.jsonl" "$DIR/$tag-iterations.jsonl"
    "${DPIN[@]}" "$B/bin/ringlmd" --model "$MODEL" --threads "$THREADS" --kv-blocks $KV --socket "$SOCK" \
        "${MAX_BATCH[@]}" --policy "$pol" "${NUMA[@]}" --request-log "$DIR/$tag-requests.jsonl" \
        --iteration-log "$DIR/$tag-iterations.jsonl" --quiet > "$DIR/$tag-ringlmd.out" 2>&1 &
    DPID=$!
    for _ in $(seq 200); do [ -S "$SOCK" ] && break; kill -0 $DPID 2> /dev/null || break; sleep 0.05; done
    [ -S "$SOCK" ] || { echo "replay_check: ringlmd did not start"; cat "$DIR/$tag-ringlmd.out"; exit 1; }
    "${CPIN[@]}" "$B/bin/ringlm" --socket "$SOCK" replay "$DIR/trace.csv" --window "${WSTART:-$START}:$WEND" --rate "$LOAD" \
        --max-context $CTX --clients "${CLIENTS:-4}" --class standard --json \
        > "$DIR/$tag-replay.json" 2> "$DIR/$tag-replay.err"
    # exit 1 with a report is requests that ended in an error (counted in the table); no JSON is a failure
    jq -e .tenants "$DIR/$tag-replay.json" > /dev/null 2>&1 || { cat "$DIR/$tag-replay.err"; exit 1; }
    kill -TERM $DPID
    wait $DPID
    DPID=
}
if [ "$FIT_RUN" = 1 ]; then
    CAL_START=$(awk -v s="$START" -v d="$CAL_SECONDS" -v x="$CAL_LOAD" 'BEGIN { v = s - d * x; printf "%.3f", v < 0 ? 0 : v }')
    LOAD=$CAL_LOAD WSTART=$CAL_START WEND=$(awk -v d="$CAL_SECONDS" -v x="$CAL_LOAD" 'BEGIN { printf "%.3f", d * x }') \
        serve cal "$POLICY"
    FIT=(--iteration-log "$DIR/cal-iterations.jsonl")
    echo "calibration run: $(jq -s length "$DIR/cal-iterations.jsonl") iterations; $("$B/bin/ringlm-sim" --trace "$DIR/trace.csv" \
        --window 0:1 --calibration "$CAL" "${FIT[@]}" 2>&1 | grep -m1 -o 'iterations-fit.*' || echo 'fit: see ringlm-sim')"
else
    FIT=()
fi

# simulate LOAD [model options, default the calibration run's fit]: the policy and the baseline
# on SECONDS_REAL of serving at LOAD; prints "goodput slo ttft_p99_ms refused" for each,
# tab-separated, on one line
simulate() {
    local x=$1; shift
    [ $# -gt 0 ] || set -- "${FIT[@]}"
    local end
    end=$(awk -v s="$START" -v x="$x" -v d="$SECONDS_REAL" 'BEGIN { printf "%.3f", s + d * x }')
    "$B/bin/ringlm-sim" --trace "$DIR/trace.csv" --window "$START:$end" --rate "$x" --calibration "$CAL" \
        --max-context $CTX --policy "$POLICY" --policy "$BASE" "$@" --json |
        jq -r '[.runs[] | .all | (.goodput_rps, .slo_attainment, .ttft_ms.p99, (.rejected + .timeouts))] | @tsv'
}
if [ -z "$LOAD" ]; then
    echo
    model="perf/calibrate's grid"
    [ ${#FIT[@]} -gt 0 ] && model="the calibration run's serving-loop fit"
    echo "simulator scan ($model, $SECONDS_REAL s of serving per load):"
    echo "| load | policy goodput | FCFS goodput | difference |"
    echo "| --- | --- | --- | --- |"
    best=-1e9
    for x in $LOADS; do
        read -r gp sp tp rp gb sb tb rb <<< "$(simulate "$x")" || exit 1
        d=$(awk -v a="$gp" -v b="$gb" 'BEGIN { printf "%.2f", a - b }')
        printf '| ×%s | %.2f | %.2f | %s |\n' "$x" "$gp" "$gb" "$d"
        if awk -v d="$d" -v b="$best" 'BEGIN { exit !(d > b) }'; then best=$d; LOAD=$x; fi
    done
    echo "they differ most at ×$LOAD"
fi
WEND=$(awk -v d="$SECONDS_REAL" -v x="$LOAD" 'BEGIN { printf "%.3f", d * x }')

# real TAG POLICY: goodput at SLO of a real run from its request log, the simulator's way;
# prints "goodput slo ttft_p99_ms refused errors"
real() {
    local ttft tpot canon
    canon=$("$B/bin/ringlmd" --model "$MODEL" --policy "$2" --check-config 2> /dev/null)
    ttft=$(awk '/^\[class standard\]/ { c = 1; next } /^\[/ { c = 0 } c && /^ttft_target/ { print $3 }' <<< "$canon")
    tpot=$(awk '/^\[class standard\]/ { c = 1; next } /^\[/ { c = 0 } c && /^tpot_target/ { print $3 }' <<< "$canon")
    jq -s -r --arg ttft "${ttft:-0}" --arg tpot "${tpot:-0}" '
        def us: if test("us$") then rtrimstr("us") | tonumber elif test("ms$") then rtrimstr("ms") | tonumber * 1000
                elif test("s$") then rtrimstr("s") | tonumber * 1e6 else tonumber end;
        ($ttft | us) as $T | ($tpot | us) as $P |
        (map(.arrival_us) | min) as $t0 | (map(.finish_us) | max) as $t1 |
        map(select(.finish_reason != "cancelled")) as $c |
        ($c | map(select((.finish_reason == "length" or .finish_reason == "stop") and .first_token_us != null
            and ($T == 0 or .first_token_us - .arrival_us <= $T)
            and ($P == 0 or .output_tokens <= 1 or (.finish_us - .first_token_us) / (.output_tokens - 1) <= $P)))
            | length) as $met |
        (map(select(.first_token_us != null) | (.first_token_us - .arrival_us) / 1000) | sort) as $tt |
        [$met / (($t1 - $t0) / 1e6), $met / ($c | length), ($tt[(($tt | length) * 0.99 | floor)] // 0),
         (map(select(.finish_reason == "rejected" or .finish_reason == "timeout")) | length),
         (map(select(.finish_reason == "error")) | length)] | @tsv' "$DIR/$1-requests.jsonl"
}
echo
echo "real runs at ×$LOAD: trace seconds [$START, $(awk -v s="$START" -v w="$WEND" 'BEGIN { print s + w }')), $SECONDS_REAL s of serving; daemon cpus $DAEMON_CPUS, clients $CLIENT_CPUS; load average $(load_avg)"
serve policy "$POLICY"
serve baseline "$BASE"
echo "load average after the runs: $(load_avg)"
read -r gp sp tp rp gb sb tb rb <<< "$(simulate "$LOAD")" || exit 1
read -r cgp x x x cgb x <<< "$(simulate "$LOAD" --service-fit auto)" || exit 1
fit() { # TAG: the simulator on that run's window with the step model fitted from its iterations
    "$B/bin/ringlm-sim" --trace "$DIR/trace.csv" --window "$START:$(awk -v s="$START" -v w="$WEND" 'BEGIN { print s + w }')" \
        --rate "$LOAD" --calibration "$CAL" --iteration-log "$DIR/$1-iterations.jsonl" --max-context $CTX \
        --policy "$2" --json | jq -r '.all | [.goodput_rps, .slo_attainment, .ttft_ms.p99, (.rejected + .timeouts)] | @tsv'
}
echo
echo "| policy | simulator goodput, calibrate grid | simulator goodput | real goodput | simulator, run's own step fit | simulator SLO | real SLO | simulator TTFT p99 s | real TTFT p99 s | simulator refused | real refused | real errors |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
row() { # NAME TAG POLICY grid-goodput sim-goodput sim-slo sim-ttft sim-refused
    local name=$1 tag=$2 pol=$3 cg=$4 g=$5 s=$6 t=$7 r=$8 rg rs rt rr re fg x
    read -r rg rs rt rr re <<< "$(real "$tag" "$pol")"
    read -r fg x <<< "$(fit "$tag" "$pol")"
    awk -v n="$name" -v cg="$cg" -v g="$g" -v s="$s" -v t="$t" -v r="$r" -v rg="$rg" -v rs="$rs" -v rt="$rt" -v rr="$rr" -v re="$re" -v fg="$fg" 'BEGIN {
        printf "| %s | %.2f | %.2f | %.2f | %.2f | %.1f%% | %.1f%% | %.2f | %.2f | %d | %d | %d |\n", n, cg, g, rg, fg, 100 * s, 100 * rs, t / 1000, rt / 1000, r, rr, re }'
}
row "$(basename "$POLICY")" policy "$POLICY" "$cgp" "$gp" "$sp" "$tp" "$rp"
row "$(basename "$BASE")" baseline "$BASE" "$cgb" "$gb" "$sb" "$tb" "$rb"
trap - EXIT
echo
echo "goodput in req/s at the standard class's targets; files in $DIR"
