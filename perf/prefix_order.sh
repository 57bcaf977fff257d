#!/usr/bin/env bash
# prefix_order.sh — prefix_order = longest_prefix against FCFS order in the simulator (DESIGN
# §10), on the shared-prefix workload.
#
# For each offered load and device KV pool size, ringlm-sim --prefix-report runs the same
# generated trace (shared system prompts, multi-turn conversations, one-off prompts) with the
# prefix cache on, once with the class in FCFS order and once in longest_prefix order (aging
# bound --max-wait), and prints side by side: hit rate, prefill tokens computed, prefill tokens
# saved against the cache off, TTFT p50 and p99.  The order matters only when requests queue:
# loads are multiples of the capacity without the cache, so the cache's own speed-up drains
# queues at low load.  A small pool is where the order decides what stays cached.
# The simulator is deterministic for a seed: one run per cell is its median.
# Usage: B=build perf/prefix_order.sh [--loads "3 5"] [--blocks "2000 8000 0"] [--max-wait 5s]
#        [--duration 20] [--param K=V ...]   (blocks 0 = the service model's pool)
# Exit 77 when ringlm-sim or jq is missing.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
LOADS="3 5"
BLOCKS="2000 8000 0"
WAIT=5s
DUR=20
PARAMS=(--param system_prompts=64)
while [ $# -gt 0 ]; do
    case "$1" in
    --loads) LOADS=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --max-wait) WAIT=$2; shift 2 ;;
    --duration) DUR=$2; shift 2 ;;
    --param) PARAMS+=(--param "$2"); shift 2 ;;
    *) echo "usage: $0 [--loads \"3 5\"] [--blocks \"2000 8000 0\"] [--max-wait 5s] [--duration S] [--param K=V ...]" >&2; exit 2 ;;
    esac
done
SIM=$B/bin/ringlm-sim
[ -x "$SIM" ] || { echo "prefix_order: $SIM missing (make)"; exit 77; }
command -v jq >/dev/null || { echo "prefix_order: jq missing (scripts/install-deps.sh)"; exit 77; }
tmp=$(mktemp -d /tmp/ringlm-prefix-order.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf '[class default]\nprefix_order = fcfs\n' > "$tmp/fcfs.policy"
printf '[class default]\nprefix_order = longest_prefix\nprefix_max_wait = %s\n' "$WAIT" > "$tmp/longest.policy"

sweep=""
for b in $BLOCKS; do [ "$b" != 0 ] && sweep="${sweep:+$sweep,}$b"; done
machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "machine: ${machine:-unknown}, $(nproc) CPUs; $(date -u +%Y-%m-%d); workload shared-prefix, ${DUR} s of conversations, ${PARAMS[*]}; built-in service model"
echo "longest_prefix: prefix_max_wait = $WAIT"
echo
echo "| load | device blocks | order | hit rate | prefill tokens | saved vs no cache | TTFT p50 ms | TTFT p99 ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for x in $LOADS; do
    for o in fcfs longest; do
        "$SIM" --workload shared-prefix --param load="$x" --param duration="$DUR" "${PARAMS[@]}" \
            --policy "$tmp/$o.policy" --prefix-report ${sweep:+--capacity-sweep "$sweep"} --json > "$tmp/$o.json" ||
            { echo "prefix_order: ringlm-sim failed (load $x, $o)"; exit 1; }
    done
    for b in $BLOCKS; do
        for o in fcfs longest; do
            name=$o; [ "$o" = longest ] && name="longest_prefix"
            jq -r --arg x "$x" --arg o "$name" --argjson b "$b" '
                .off.prefix_cache.prefill_tokens as $off
                | (if $b == 0 then .on else (.capacity_sweep[] | select(.device_blocks == $b)) end) as $p
                | "| \($x) | \($p.device_blocks) | \($o) | \($p.prefix_cache.hit_rate * 1000 | round / 10)% | \($p.prefix_cache.prefill_tokens) | \((1 - $p.prefix_cache.prefill_tokens / $off) * 1000 | round / 10)% | \($p.ttft_p50_ms * 10 | round / 10) | \($p.ttft_p99_ms * 10 | round / 10) |"' \
                "$tmp/$o.json"
        done
    done
done
