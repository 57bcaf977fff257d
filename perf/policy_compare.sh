#!/usr/bin/env bash
# policy_compare.sh — the shipped default policy against FCFS on the Azure traces.
#
# For the conversation and code traces at ×1..×4 of their recorded rate, ringlm-sim replays
# each trace through the shipped default (sim/policies/token-budget.policy, the tuned output
# of `ringlm-sim --tune`) and through FCFS (sim/policies/fcfs.policy) with the built-in service
# model, side by side, and prints goodput at SLO, SLO attainment and TTFT p99 of each, the
# goodput ratio and the goal; then the two-tenant split of each trace
# (--tenants random:a:3,b:1): every tenant's served tokens against its max-min fair share.
# The simulator is deterministic for a seed, so one run per cell is its median.
# Goal: where FCFS is below 100% SLO attainment, the default's goodput >=
# min(1.3 × FCFS, 0.95 × offered rate); where FCFS meets every SLO, >= 0.98 × FCFS; no tenant
# below 0.9 of its fair share.  Next to each goal, the most goodput any policy could reach
# there (build/perf/goodput_bound, sim_tune_goodput_bound: every prompt's prefill must fit
# within its TTFT target of its arrival under the service model); a goal above it is marked
# "unreachable": no policy meets it, whatever its knobs.  Exit 1 when a goal below its bound is
# missed (or a tenant is under the floor), 77 when traces or programs are missing.
# With --max-context N (a small model's daemon: stories260K has 512) every request is first
# fitted into N tokens as `ringlm replay --max-context N` fits it (perf/clip_azure.sh), so the
# comparison is of the requests that daemon is really sent.
# Usage: B=build perf/policy_compare.sh [--policy FILE] [--baseline FILE] [--loads "1 2 3 4"]
#        [--calibration FILE] [--max-context N]   (env RINGLM_SHARED: where traces/ is, default ../shared)
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
SHARED=${RINGLM_SHARED:-../shared}
POLICY=sim/policies/token-budget.policy
BASE=sim/policies/fcfs.policy
LOADS="1 2 3 4"
CAL=()
CTX=()
while [ $# -gt 0 ]; do
    case "$1" in
    --policy) POLICY=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    --loads) LOADS=$2; shift 2 ;;
    --calibration) CAL=(--calibration "$2"); shift 2 ;;
    --max-context) CTX=(--max-context "$2"); shift 2 ;;
    *) echo "usage: $0 [--policy FILE] [--baseline FILE] [--loads \"1 2 3 4\"] [--calibration FILE] [--max-context N]" >&2; exit 2 ;;
    esac
done
SIM=$B/bin/ringlm-sim
BOUND=$B/perf/goodput_bound
for f in "$SIM" "$BOUND" "$SHARED/traces/AzureLLMInferenceTrace_conv.csv" "$SHARED/traces/AzureLLMInferenceTrace_code.csv"; do
    [ -e "$f" ] || { echo "policy_compare: $f missing (make; RINGLM_SHARED)"; exit 77; }
done
command -v jq >/dev/null || { echo "policy_compare: jq missing (scripts/install-deps.sh)"; exit 77; }
TRACES=$SHARED/traces
if [ ${#CTX[@]} -gt 0 ]; then
    TRACES=$(mktemp -d /tmp/ringlm-policy-compare.XXXXXX)
    trap 'rm -rf "$TRACES"' EXIT
    for tr in conv code; do
        perf/clip_azure.sh "${CTX[1]}" < "$SHARED/traces/AzureLLMInferenceTrace_$tr.csv" > "$TRACES/AzureLLMInferenceTrace_$tr.csv"
    done
fi

machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "machine: ${machine:-unknown}, $(nproc) CPUs; $(date -u +%Y-%m-%d); policy $POLICY vs $BASE; service ${CAL[1]:-built-in}; context ${CTX[1]:-as recorded}"
echo
fail=0 met=0 rows=0 unreachable=0
echo "| trace | load | offered req/s | default goodput | FCFS goodput | ratio | default SLO | FCFS SLO | default TTFT p99 s | FCFS TTFT p99 s | goal | bound | met |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for tr in conv code; do
    for x in $LOADS; do
        out=$("$SIM" --trace "$TRACES/AzureLLMInferenceTrace_$tr.csv" --rate "$x" "${CAL[@]}" "${CTX[@]}" \
              --policy "$POLICY" --policy "$BASE" --json) || { echo "policy_compare: ringlm-sim failed ($tr ×$x)" >&2; exit 1; }
        row=$(jq -r '.runs as $r | [$r[0].trace.requests, $r[0].trace.span_s,
                 $r[0].all.goodput_rps, $r[1].all.goodput_rps, $r[0].all.slo_attainment, $r[1].all.slo_attainment,
                 $r[0].all.ttft_ms.p99, $r[1].all.ttft_ms.p99] | @tsv' <<<"$out")
        read -r n span gd gf sd sf td tf <<<"$row"
        bound=$("$BOUND" --trace "$TRACES/AzureLLMInferenceTrace_$tr.csv" --rate "$x" "${CAL[@]}" --policy "$POLICY" |
                jq -r .goodput_bound_rps) || { echo "policy_compare: goodput_bound failed ($tr ×$x)" >&2; exit 1; }
        awk -v tr="$tr" -v x="$x" -v n="$n" -v span="$span" -v gd="$gd" -v gf="$gf" -v sd="$sd" -v sf="$sf" \
            -v td="$td" -v tf="$tf" -v b="$bound" 'BEGIN {
            off = n / span
            if (sf < 0.99995) { goal = 1.3 * gf; if (0.95 * off < goal) goal = 0.95 * off; g = sprintf("≥ %.2f", goal) }
            else { goal = 0.98 * gf; g = sprintf("≥ %.2f (0.98×)", goal) }
            ok = gd >= goal - 1e-9
            m = ok ? "yes" : goal > b + 1e-9 ? "no: unreachable" : "NO"
            printf "| %s | ×%s | %.2f | %.2f | %.2f | %.2f | %.1f%% | %.1f%% | %.2f | %.2f | %s | %.2f | %s |\n",
                   tr, x, off, gd, gf, (gf > 0 ? gd / gf : 0), 100 * sd, 100 * sf, td / 1000, tf / 1000, g, b, m
            exit ok ? 0 : goal > b + 1e-9 ? 2 : 1 }'
        case $? in 0) met=$((met + 1)) ;; 2) unreachable=$((unreachable + 1)) ;; *) fail=1 ;; esac
        rows=$((rows + 1))
    done
done
echo
echo "goals met: $met of $rows; unreachable by any policy (goal above the bound): $unreachable"
echo
echo "two-tenant split (--tenants random:a:3,b:1): served tokens / max-min fair share"
echo
echo "| trace | load | default a | default b | FCFS a | FCFS b | default ≥ 0.9 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for tr in conv code; do
    for x in $LOADS; do
        out=$("$SIM" --trace "$TRACES/AzureLLMInferenceTrace_$tr.csv" --rate "$x" "${CAL[@]}" "${CTX[@]}" \
              --tenants random:a:3,b:1 --policy "$POLICY" --policy "$BASE" --json) || exit 1
        row=$(jq -r '.runs as $r | [$r[0].tenants.a.normalised_service, $r[0].tenants.b.normalised_service,
                 $r[1].tenants.a.normalised_service, $r[1].tenants.b.normalised_service] | @tsv' <<<"$out")
        read -r da db fa fb <<<"$row"
        awk -v tr="$tr" -v x="$x" -v da="$da" -v db="$db" -v fa="$fa" -v fb="$fb" 'BEGIN {
            ok = da >= 0.9 && db >= 0.9
            printf "| %s | ×%s | %.3f | %.3f | %.3f | %.3f | %s |\n", tr, x, da, db, fa, fb, (ok ? "yes" : "NO")
            exit ok ? 0 : 1 }' || fail=1
    done
done
exit $fail
