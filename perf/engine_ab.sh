#!/usr/bin/env bash
# engine_ab.sh — the engine of this tree against a baseline engine, side by side: the same
# engine_bench source (this tree's) is built against the baseline's engine (a git ref,
# default main, in a temporary detached worktree), then the two binaries run alternately,
# --runs times each, so load from other users of the machine hits both alike. Prints, per
# sequence count, the median decode tok/s over the runs with the lowest and highest run,
# and the ratio of the medians; --json writes the same as one JSON object.
#
#   B=build perf/engine_ab.sh [--base REF] [--runs N] [--json] [-- engine_bench options]
#   e.g. perf/engine_ab.sh --base f927083 --runs 5 -- --model synthetic:stories110M:1 \
#            --context 32 --steps 128 --seqs 1,4,8,16,32 --repeats 1
# Needs git, make, jq; this tree built (make). Exit 77 when jq is missing.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
BASE=main RUNS=5 JSON=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --) shift; break ;;
    *) echo "usage: perf/engine_ab.sh [--base REF] [--runs N] [--json] [-- engine_bench options]" >&2
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
git worktree add -q --detach "$tmp/base" "$BASE"
# this tree's bench, the baseline's engine; and this tree's check of OpenBLAS's kernels where
# the baseline has none (the bench calls it: the core OpenBLAS runs is the machine's setting)
cp perf/engine_bench.c perf/bench_util.h "$tmp/base/perf/"
[ -e "$tmp/base/kernels/cpu/blas_core.c" ] || cp kernels/cpu/blas_core.[ch] "$tmp/base/kernels/cpu/"
make -C "$tmp/base" -j2 CUDA=0 build/perf/engine_bench >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; echo "engine_ab.sh: baseline $BASE does not build" >&2; exit 1; }

for r in $(seq "$RUNS"); do
  "$tmp/engine_bench.new" "$@" --json >>"$tmp/new.jsonl"
  "$tmp/base/build/perf/engine_bench" "$@" --json >>"$tmp/base.jsonl"
done

summary=$(jq -n --slurpfile new "$tmp/new.jsonl" --slurpfile base "$tmp/base.jsonl" \
  --arg ref "$BASE" --arg head "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)" '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def stats($runs): ($runs[0].decode_tok_s | keys_unsorted) as $ks
    | reduce $ks[] as $k ({}; .[$k] = ([$runs[].decode_tok_s[$k]]
        | {median: (median * 10 | round / 10), lowest: min, highest: max}));
  (stats($new)) as $n | (stats($base)) as $b
  | {model: $new[0].model, threads: $new[0].threads, context: $new[0].context,
     decode_steps: $new[0].decode_steps, runs: ($new | length),
     new: {rev: $head, decode_tok_s: $n}, base: {rev: $ref, decode_tok_s: $b},
     ratio: (reduce ($n | keys_unsorted)[] as $k ({}; .[$k] =
        ((($n[$k].median / $b[$k].median) * 100 | round) / 100)))}')
if [ "$JSON" = 1 ]; then
  echo "$summary" | jq -c .
else
  echo "$summary" | jq -r '
    "engine_ab \(.model), \(.threads) threads, \(.runs) alternating runs, \(.decode_steps) steps after \(.context) tokens",
    "seqs   new \(.new.rev) tok/s [lowest, highest]     base \(.base.rev) tok/s [lowest, highest]   new/base",
    (.new.decode_tok_s | keys_unsorted[]) as $k
    | "\($k | .[0:4] | " " * (4 - length) + .)   \(.new.decode_tok_s[$k] | "\(.median) [\(.lowest), \(.highest)]")      \(.base.decode_tok_s[$k] | "\(.median) [\(.lowest), \(.highest)]")      \(.ratio[$k])x"'
fi
