#!/usr/bin/env bash
# engine_ab.sh — the engine of this tree against a baseline engine, side by side: the same
# engine_bench source (this tree's) is built against the baseline's engine (a git ref,
# default main, in a temporary detached worktree), then the two binaries run alternately,
# --runs times each, so load from other users of the machine hits both alike. Prints, per
# sequence count, the median decode tok/s over the runs with the lowest and highest run,
# and the ratio of the medians, then the same for prefill (--prefill N: one prompt of N rows);
# --json writes the same as one JSON object.
#
#   B=build perf/engine_ab.sh [--base REF | --base-bin PATH] [--runs N] [--json]
#                             [-- engine_bench options]
# --base-bin: an engine_bench built from the baseline before (no worktree, no build).
#   e.g. perf/engine_ab.sh --base f927083 --runs 5 -- --model synthetic:stories110M:1 \
#            --context 32 --steps 128 --seqs 1,4,8,16,32 --repeats 1
# Needs git, make, jq; this tree built (make). Exit 77 when jq is missing.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
BASE=main RUNS=5 JSON=0 BASE_BIN=
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --base-bin) BASE_BIN=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --) shift; break ;;
    *) echo "usage: perf/engine_ab.sh [--base REF | --base-bin PATH] [--runs N] [--json]" \
         "[-- engine_bench options]" >&2
       exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "engine_ab.sh: jq not found" >&2; exit 77; }
[ -x "$B/perf/engine_bench" ] || { echo "engine_ab.sh: $B/perf/engine_bench not built (make)" >&2; exit 1; }

tmp=$(mktemp -d)
cp "$B/perf/engine_bench" "$tmp/engine_bench.new" # a rebuild meanwhile does not disturb the runs
cleanup() {
  git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
base_bin=$tmp/base/build/perf/engine_bench
if [ -n "$BASE_BIN" ]; then # built before (by an earlier run of this script, or by hand)
  [ -x "$BASE_BIN" ] || { echo "engine_ab.sh: --base-bin $BASE_BIN is not a program" >&2; exit 1; }
  base_bin=$BASE_BIN BASE=$BASE_BIN
else
  git worktree add -q --detach "$tmp/base" "$BASE"
  # this tree's bench, the baseline's engine; and this tree's check of OpenBLAS's kernels where
  # the baseline has none (the bench calls it: the core OpenBLAS runs is the machine's setting)
  cp perf/engine_bench.c perf/bench_util.h "$tmp/base/perf/"
  [ -e "$tmp/base/kernels/cpu/blas_core.c" ] || cp kernels/cpu/blas_core.[ch] "$tmp/base/kernels/cpu/"
  make -C "$tmp/base" -j2 CUDA=0 build/perf/engine_bench >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log" >&2; echo "engine_ab.sh: baseline $BASE does not build" >&2; exit 1; }
fi

for r in $(seq "$RUNS"); do
  "$tmp/engine_bench.new" "$@" --json >>"$tmp/new.jsonl"
  "$base_bin" "$@" --json >>"$tmp/base.jsonl"
done

summary=$(jq -n --slurpfile new "$tmp/new.jsonl" --slurpfile base "$tmp/base.jsonl" \
  --arg ref "$BASE" --arg head "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)" '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def stats($runs): ($runs[0].decode_tok_s | keys_unsorted) as $ks
    | reduce $ks[] as $k ({}; .[$k] = ([$runs[].decode_tok_s[$k]]
        | {median: (median * 10 | round / 10), lowest: min, highest: max}));
  def pstats($runs): [$runs[].prefill_tok_s]
    | {median: (median * 10 | round / 10), lowest: min, highest: max};
  (stats($new)) as $n | (stats($base)) as $b | (pstats($new)) as $np | (pstats($base)) as $bp
  | {model: $new[0].model, threads: $new[0].threads, context: $new[0].context,
     decode_steps: $new[0].decode_steps, prefill_len: $new[0].prefill_len,
     runs: ($new | length),
     new: {rev: $head, decode_tok_s: $n, prefill_tok_s: $np},
     base: {rev: $ref, decode_tok_s: $b, prefill_tok_s: $bp},
     ratio: (reduce ($n | keys_unsorted)[] as $k ({}; .[$k] =
        ((($n[$k].median / $b[$k].median) * 100 | round) / 100))),
     prefill_ratio: ((($np.median / $bp.median) * 100 | round) / 100)}')
if [ "$JSON" = 1 ]; then
  echo "$summary" | jq -c .
else
  echo "$summary" | jq -r '
    "engine_ab \(.model), \(.threads) threads, \(.runs) alternating runs, \(.decode_steps) steps after \(.context) tokens",
    "seqs   new \(.new.rev) tok/s [lowest, highest]     base \(.base.rev) tok/s [lowest, highest]   new/base",
    (.new.decode_tok_s | keys_unsorted[]) as $k
    | "\($k | .[0:4] | " " * (4 - length) + .)   \(.new.decode_tok_s[$k] | "\(.median) [\(.lowest), \(.highest)]")      \(.base.decode_tok_s[$k] | "\(.median) [\(.lowest), \(.highest)]")      \(.ratio[$k])x",
    "prefill \(.prefill_len) rows: \(.new.prefill_tok_s | "\(.median) [\(.lowest), \(.highest)]") tok/s   base \(.base.prefill_tok_s | "\(.median) [\(.lowest), \(.highest)]")   \(.prefill_ratio)x"'
fi
