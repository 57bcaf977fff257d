#!/usr/bin/env bash
# llama_compare.sh — ringlm's engine against llama.cpp, side by side on the same GGUF files:
# decode tok/s at 1/4/8/16/32 sequences (32-token prompts, 128 generated tokens, logits for
# every sequence at every step, as llama-batched-bench counts them) and prefill tok/s of one
# 256- and one 1024-token prompt, for each model shape and weight type, the same thread count.
#
# For each shape and type a GGUF file is written with ringlm-mkmodel (synthetic weights from
# the preset); then, --runs times, perf/engine_bench and llama.cpp's llama-batched-bench run
# one after the other on it, so load from other users of the machine hits both alike.
# perf/machine_probe runs before the first and after the last run: the memory read bandwidth,
# the f32 FMA peak and OpenBLAS's SGEMM rate (and the core it chose) of this machine now.
# Prints per file the median of each figure with the lowest and highest run, ringlm/llama.cpp
# on the medians, and batch-1 decode as a share of the probed read bandwidth (the file's
# bytes read once per token). Prefill lengths beyond a model's context (stories15M: 256) are
# not run. --json writes one JSON object per file instead of the tables.
#
#   B=build perf/llama_compare.sh [--models stories15M,stories110M]
#          [--types F32,F16,BF16,Q8_0,Q4_K_M] [--seqs 1,4,8,16,32] [--prefill 256,1024]
#          [--runs 3] [--threads 2] [--keep DIR] [--json]
#
# llama.cpp: LLAMA_CPP_DIR (default /work/llama-build/build/bin) must hold llama-batched-bench,
# built natively, outside this repository, from the source node-llama-cpp ships:
#   git clone tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle /work/llama-build/src
#   cmake -S /work/llama-build/src -B /work/llama-build/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
#         -DCMAKE_BUILD_TYPE=Release && cmake --build /work/llama-build/build -j2 \
#         --target llama-batched-bench llama-server
# Quantized types run with --no-repack (its AMX repack dies with SIGILL on VMs that report AMX
# without enabling it). Without llama-batched-bench the script says so, skips llama.cpp and
# measures ringlm alone (CI does not build llama.cpp). --keep DIR keeps the files there and
# reuses them. Needs jq (exit 77 without it) and this tree built (make).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama-build/build/bin}
MODELS=stories15M,stories110M TYPES=F32,F16,BF16,Q8_0,Q4_K_M SEQS=1,4,8,16,32 PREFILL=256,1024
RUNS=3 THREADS=2 JSON=0 KEEP=
PROMPT=32 GEN=128
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS=$2; shift 2 ;;
    --types|--type) TYPES=$2; shift 2 ;;
    --seqs) SEQS=$2; shift 2 ;;
    --prefill) PREFILL=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    *) usage ;;
  esac
done
command -v jq >/dev/null || { echo "llama_compare.sh: jq not found" >&2; exit 77; }
for p in bin/ringlm-mkmodel perf/engine_bench perf/machine_probe; do
  [ -x "$B/$p" ] || { echo "llama_compare.sh: $B/$p not built (make)" >&2; exit 1; }
done
LLAMA=$LLAMA_CPP_DIR/llama-batched-bench
if [ -x "$LLAMA" ]; then
  have_llama=1
else
  have_llama=0
  echo "llama_compare.sh: $LLAMA not built (set LLAMA_CPP_DIR; build it as this script's" \
       "header says): skipping llama.cpp, measuring ringlm alone" >&2
fi
max_seqs=$(echo "$SEQS" | tr ',' '\n' | sort -n | tail -1)
max_pre=$(echo "$PREFILL" | tr ',' '\n' | sort -n | tail -1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=${KEEP:-$tmp}
mkdir -p "$dir"
cp "$B/perf/engine_bench" "$tmp/engine_bench" # a rebuild meanwhile does not disturb the runs
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
"$B/perf/machine_probe" --threads "$THREADS" --repeats 3 --json >"$tmp/probe.jsonl"

files=()
for preset in ${MODELS//,/ }; do
  for type in ${TYPES//,/ }; do
    f=$dir/$preset-$type.gguf
    if [ ! -s "$f" ]; then
      "$B/bin/ringlm-mkmodel" --model "synthetic:$preset:1" --format gguf --type "$type" \
        --placeholder-vocab --out "$f" >"$tmp/mkmodel.log" 2>&1 ||
        { cat "$tmp/mkmodel.log" >&2; echo "llama_compare.sh: cannot write $f" >&2; exit 1; }
    fi
    files+=("$f")
    : >"$tmp/$preset-$type.ringlm.jsonl"
    : >"$tmp/$preset-$type.pre.jsonl"
    : >"$tmp/$preset-$type.llama.jsonl"
  done
done

for r in $(seq "$RUNS"); do
  for f in "${files[@]}"; do
    base=$(basename "$f" .gguf)
    # decode at every sequence count, with the first prefill length's figure
    "$tmp/engine_bench" --model "$f" --threads "$THREADS" --context "$PROMPT" --steps "$GEN" \
      --seqs "$SEQS" --repeats 1 --no-naive --json >>"$tmp/$base.ringlm.jsonl"
    for p in ${PREFILL//,/ }; do
      "$tmp/engine_bench" --model "$f" --threads "$THREADS" --context 1 --steps 1 --seqs 1 \
        --prefill "$p" --repeats 1 --no-naive --json |
        jq -c --argjson want "$p" 'select(.prefill_len == $want)
                                   | {pp: .prefill_len, tok_s: .prefill_tok_s}' \
        >>"$tmp/$base.pre.jsonl"
    done
    if [ "$have_llama" = 1 ]; then
      extra=()
      case "$base" in *-Q*) extra=(--no-repack) ;; esac
      # every sequence count in one process; each sequence has its own prompt (not shared)
      ctx=$((max_seqs * (PROMPT + GEN)))
      [ "$ctx" -gt $((max_pre + 1)) ] || ctx=$((max_pre + 1))
      "$LLAMA" -m "$f" -t "$THREADS" -c "$ctx" -b 2048 -ub 512 -npp "$PROMPT" -ntg "$GEN" \
        -npl "$SEQS" "${extra[@]}" --output-format jsonl 2>"$tmp/llama.log" |
        grep '^{' | jq -c '{kind: "tg", pl, v: .speed_tg}' >>"$tmp/$base.llama.jsonl" ||
        { tail -20 "$tmp/llama.log" >&2; echo "llama_compare.sh: llama-batched-bench failed on $f" >&2
          exit 1; }
      # prefill: one sequence, one token generated (its figure is not used); only the lengths
      # ringlm ran (within the model's context)
      pps=$(jq -r '.pp' "$tmp/$base.pre.jsonl" | sort -un | paste -sd, -)
      if [ -n "$pps" ]; then
        "$LLAMA" -m "$f" -t "$THREADS" -c $((max_pre + 8)) -b 2048 -ub 2048 -npp "$pps" -ntg 1 \
          -npl 1 "${extra[@]}" --output-format jsonl 2>"$tmp/llama.log" |
          grep '^{' | jq -c '{kind: "pp", pp, v: .speed_pp}' >>"$tmp/$base.llama.jsonl" ||
          { tail -20 "$tmp/llama.log" >&2; echo "llama_compare.sh: llama-batched-bench failed on $f" >&2
            exit 1; }
      fi
    fi
  done
done
"$B/perf/machine_probe" --threads "$THREADS" --repeats 3 --json >>"$tmp/probe.jsonl"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

probe=$(jq -s '{cpu_features: .[0].cpu_features, openblas_core: .[0].openblas_core,
                read_gb_s: [.[].read_gb_s.median], fma_gflop_s: [.[].fma_f32_gflop_s.median],
                sgemm_gflop_s: [.[].sgemm_1024_gflop_s.median],
                sgemm_prefill_1thread_gflop_s: [.[].sgemm_256x768x768_1thread_gflop_s.median]}' \
  "$tmp/probe.jsonl")
if [ "$JSON" = 0 ]; then
  echo "$probe" | jq -r '"machine (probed before and after the runs): \(.cpu_features); OpenBLAS core \(.openblas_core)",
    "  read \(.read_gb_s | map(tostring) | join(" / ")) GB/s; f32 FMA peak \(.fma_gflop_s | map(tostring) | join(" / ")) GFLOP/s;",
    "  SGEMM 1024^3 \(.sgemm_gflop_s | map(tostring) | join(" / ")) GFLOP/s; 256x768x768 on 1 thread \(.sgemm_prefill_1thread_gflop_s | map(tostring) | join(" / ")) GFLOP/s"'
  echo "load average: $load_start at the start, $load_end at the end ($(nproc) CPUs)"
fi

for f in "${files[@]}"; do
  base=$(basename "$f" .gguf)
  bytes=$(stat -c %s "$f")
  summary=$(jq -n --slurpfile r "$tmp/$base.ringlm.jsonl" --slurpfile p "$tmp/$base.pre.jsonl" \
    --slurpfile l "$tmp/$base.llama.jsonl" --argjson probe "$probe" --arg file "$base" \
    --argjson threads "$THREADS" --argjson have_llama "$have_llama" --arg seqs "$SEQS" \
    --arg prefill "$PREFILL" --argjson prompt "$PROMPT" --argjson gen "$GEN" \
    --argjson bytes "$bytes" --argjson runs "$RUNS" '
    def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                       else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def r1: . * 10 | round / 10;
    def stats: if length == 0 then null
               else {median: (median | r1), lowest: (min | r1), highest: (max | r1)} end;
    def ratio($a; $b): if $a == null or $b == null then null
                       else (($a.median / $b.median) * 100 | round) / 100 end;
    ($seqs | split(",")) as $ks | ($prefill | split(",")) as $ps
    | (reduce $ks[] as $k ({}; .[$k] = ([$r[].decode_tok_s[$k]] | stats))) as $rd
    | (reduce $ps[] as $q ({}; .[$q] = ([$p[] | select(.pp == ($q | tonumber)) | .tok_s] | stats)))
        as $rp
    | (if $have_llama == 1 then
         reduce $ks[] as $k ({}; .[$k] = ([$l[] | select(.kind == "tg" and .pl == ($k | tonumber))
                                           | .v] | stats))
       else null end) as $ld
    | (if $have_llama == 1 then
         reduce $ps[] as $q ({}; .[$q] = ([$l[] | select(.kind == "pp" and .pp == ($q | tonumber))
                                           | .v] | stats))
       else null end) as $lp
    | ($probe.read_gb_s | median) as $bw
    | {file: $file, threads: $threads, runs: $runs, prompt: $prompt, generated: $gen,
       file_bytes: $bytes,
       decode: {ringlm: $rd, llama_cpp: $ld,
                ratio: (if $ld == null then null
                        else reduce $ks[] as $k ({}; .[$k] = ratio($rd[$k]; $ld[$k])) end)},
       prefill: {ringlm: $rp, llama_cpp: $lp,
                 ratio: (if $lp == null then null
                         else reduce $ps[] as $q ({}; .[$q] = ratio($rp[$q]; $lp[$q])) end)},
       batch1_read_share: {
         ringlm: (if $rd["1"] == null then null
                  else ($rd["1"].median * $bytes / 1e9 / $bw * 100 | round) / 100 end),
         llama_cpp: (if $ld == null or $ld["1"] == null then null
                     else ($ld["1"].median * $bytes / 1e9 / $bw * 100 | round) / 100 end)},
       probe: $probe}')
  if [ "$JSON" = 1 ]; then
    echo "$summary" | jq -c .
    continue
  fi
  echo "$summary" | jq -r '
    def cell: if . == null then "(not run)" else "\(.median) [\(.lowest), \(.highest)]" end;
    def pad($n): . + " " * ([$n - length, 0] | max);
    "",
    "\(.file): \(.threads) threads, \(.runs) runs each; tok/s median [lowest, highest]",
    "             ringlm                        llama.cpp                     ringlm/llama.cpp",
    (.decode as $d | $d.ringlm | keys_unsorted[] as $k
     | ("decode @" + $k | pad(12)) + " " + ($d.ringlm[$k] | cell | pad(29)) + " "
       + ((if $d.llama_cpp == null then null else $d.llama_cpp[$k] end) | cell | pad(29)) + " "
       + (if $d.ratio == null or $d.ratio[$k] == null then "-" else "\($d.ratio[$k])x" end)),
    (.prefill as $d | $d.ringlm | keys_unsorted[] as $k
     | select($d.ringlm[$k] != null)
     | ("prefill " + $k | pad(12)) + " " + ($d.ringlm[$k] | cell | pad(29)) + " "
       + ((if $d.llama_cpp == null then null else $d.llama_cpp[$k] end) | cell | pad(29)) + " "
       + (if $d.ratio == null or $d.ratio[$k] == null then "-" else "\($d.ratio[$k])x" end)),
    "batch-1 decode reads the file (\(.file_bytes / 1e6 | round) MB) at \(.batch1_read_share.ringlm)"
    + " of the probed read bandwidth (llama.cpp \(.batch1_read_share.llama_cpp // "-"))"'
done
