#!/usr/bin/env bash
# llama_compare.sh — ringlm's engine against llama.cpp, side by side on the same GGUF file:
# decode tok/s at 1/4/8/16/32 sequences, 32-token prompts, 128 generated tokens, logits for
# every sequence at every step, the same thread count (llama-batched-bench's figures).
#
# For each model shape a GGUF file is written with ringlm-mkmodel (synthetic weights from
# the preset, type --type); then, --runs times, perf/engine_bench and llama.cpp's native
# llama-batched-bench run one after the other, so load from other users of the machine
# hits both alike. Prints per model and sequence count the median tok/s of each with the
# lowest and highest run, and ringlm/llama.cpp; --json writes one JSON object per model.
#
#   B=build perf/llama_compare.sh [--models stories15M,stories110M] [--seqs 1,4,8,16,32]
#                                 [--runs 3] [--threads 2] [--type F32] [--json]
#
# llama.cpp: LLAMA_CPP_DIR (default /work/llama.cpp/build/bin) must hold llama-batched-bench,
# built natively from the source node-llama-cpp ships (docs/models.md:
# cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, CPU only). Without it the script says so and
# measures ringlm alone. Needs jq (exit 77 without it) and this tree built (make).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp/build/bin}
MODELS=stories15M,stories110M SEQS=1,4,8,16,32 RUNS=3 THREADS=2 TYPE=F32 JSON=0
PROMPT=32 GEN=128
usage() {
  echo "usage: perf/llama_compare.sh [--models P1,P2] [--seqs 1,4,...] [--runs N] [--threads N]" \
       "[--type F32|F16|Q8_0|...] [--json]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS=$2; shift 2 ;;
    --seqs) SEQS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --type) TYPE=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    *) usage ;;
  esac
done
command -v jq >/dev/null || { echo "llama_compare.sh: jq not found" >&2; exit 77; }
for p in bin/ringlm-mkmodel perf/engine_bench; do
  [ -x "$B/$p" ] || { echo "llama_compare.sh: $B/$p not built (make)" >&2; exit 1; }
done
LLAMA=$LLAMA_CPP_DIR/llama-batched-bench
if [ -x "$LLAMA" ]; then
  have_llama=1
else
  have_llama=0
  echo "llama_compare.sh: $LLAMA not found (set LLAMA_CPP_DIR; build it as this script's header says):" \
       "measuring ringlm alone" >&2
fi
max_seqs=$(echo "$SEQS" | tr ',' '\n' | sort -n | tail -1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$B/perf/engine_bench" "$tmp/engine_bench" # a rebuild meanwhile does not disturb the runs

for preset in $(echo "$MODELS" | tr ',' ' '); do
  gguf=$tmp/$preset-$TYPE.gguf
  "$B/bin/ringlm-mkmodel" --model "synthetic:$preset:1" --format gguf --type "$TYPE" \
    --placeholder-vocab --out "$gguf" >"$tmp/mkmodel.log" 2>&1 ||
    { cat "$tmp/mkmodel.log" >&2; echo "llama_compare.sh: cannot write $gguf" >&2; exit 1; }
  : >"$tmp/ringlm.jsonl"
  : >"$tmp/llama.jsonl"
  for r in $(seq "$RUNS"); do
    "$tmp/engine_bench" --model "$gguf" --threads "$THREADS" --context "$PROMPT" \
      --steps "$GEN" --seqs "$SEQS" --repeats 1 --no-naive --json >>"$tmp/ringlm.jsonl"
    if [ "$have_llama" = 1 ]; then
      # one run: every sequence count in one process; each sequence has its own prompt
      # (not shared), so the KV cache holds max_seqs * (prompt + generated) tokens.
      "$LLAMA" -m "$gguf" -t "$THREADS" -c $((max_seqs * (PROMPT + GEN))) -b 2048 -ub 512 \
        -npp "$PROMPT" -ntg "$GEN" -npl "$SEQS" --output-format jsonl 2>"$tmp/llama.log" |
        grep '^{' | jq -c --arg run "$r" '{run: $run, pl, speed_tg}' >>"$tmp/llama.jsonl" ||
        { tail -20 "$tmp/llama.log" >&2; echo "llama_compare.sh: llama-batched-bench failed" >&2
          exit 1; }
    fi
  done
  summary=$(jq -n --slurpfile r "$tmp/ringlm.jsonl" --slurpfile l "$tmp/llama.jsonl" \
    --arg preset "$preset" --arg type "$TYPE" --argjson threads "$THREADS" \
    --argjson have_llama "$have_llama" --arg seqs "$SEQS" --argjson prompt "$PROMPT" --argjson gen "$GEN" '
    def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                       else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def stats: {median: (median * 10 | round / 10), lowest: (min * 10 | round / 10),
                highest: (max * 10 | round / 10)};
    ($seqs | split(",")) as $ks
    | (reduce $ks[] as $k ({}; .[$k] = ([$r[].decode_tok_s[$k]] | stats))) as $rs
    | (if $have_llama == 1 then
         reduce $ks[] as $k ({}; .[$k] = ([$l[] | select(.pl == ($k | tonumber)) | .speed_tg]
                                         | if length > 0 then stats else null end))
       else null end) as $ls
    | {model: $preset, type: $type, threads: $threads, runs: ($r | length),
       prompt: $prompt, generated: $gen, ringlm: $rs, llama_cpp: $ls,
       ratio: (if $ls == null then null else
                 reduce $ks[] as $k ({}; .[$k] = (if $ls[$k] == null then null else
                   (($rs[$k].median / $ls[$k].median) * 100 | round) / 100 end)) end)}')
  if [ "$JSON" = 1 ]; then
    echo "$summary" | jq -c .
  else
    echo "$summary" | jq -r '
      "llama_compare \(.model) \(.type), \(.threads) threads, \(.runs) runs each, " +
      "\(.prompt)-token prompts, \(.generated) generated; decode tok/s median [lowest, highest]",
      "seqs   ringlm                          llama.cpp                       ringlm/llama.cpp",
      (.ringlm | keys_unsorted[]) as $k
      | "\($k | " " * (4 - length) + .)   \(.ringlm[$k] | "\(.median) [\(.lowest), \(.highest)]" | . + " " * (32 - length))" +
        (if .llama_cpp == null or .llama_cpp[$k] == null then "(not run)"
         else "\(.llama_cpp[$k] | "\(.median) [\(.lowest), \(.highest)]" | . + " " * (32 - length))\(.ratio[$k])x" end)'
  fi
done
