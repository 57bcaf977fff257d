#!/usr/bin/env bash
# gguf_compare.sh — ringlm on GGUF files, each next to llama.cpp on the very same file:
# decode tok/s at 1, 8 and 32 sequences (32-token prompts, 128 generated tokens, as llama.cpp's
# llama-batched-bench counts them), prefill tok/s, ringlm's load time and resident memory.
# The files are written by ringlm-mkmodel from the synthetic shapes (weights from a seed) in
# each type; ringlm (perf/engine_bench) and llama.cpp (llama-batched-bench, same thread count)
# run alternately, --runs times each, so load from other users of the machine hits both
# alike; the table gives medians, and the ratios ringlm / llama.cpp.
#
#   B=build perf/gguf_compare.sh [--shapes stories15M,stories110M] [--types F32,F16,Q8_0,Q4_K_M]
#                                [--threads 2] [--runs 3] [--llama-bin DIR] [--keep DIR]
#
# llama.cpp: its native tools, not the node binding (which runs about half as fast per token).
# --llama-bin (default $LLAMA_CPP_BIN, else /work/llama.cpp/build/bin) must hold
# llama-batched-bench; build it from the source node-llama-cpp ships (git clone
# tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle, cmake -DGGML_NATIVE=ON, CPU
# only). Without it the script says so and measures ringlm alone. Q8_0 runs with --no-repack
# (the VM's AMX path dies on ldtilecfg). Rows that are not whole 256-element blocks (the
# stories15M shape's 288) are written as Q8_0 by both quantizers' rules, so that shape's
# Q4_K_M is mostly Q8_0 (ringlm-mkmodel prints which).
# --keep DIR keeps the files and the per-run results there; a later run with the same DIR reuses
# the files and adds its runs to the medians. Needs jq. Exit 77 when jq is missing.
# After the medians: the spread (min-max over the runs) of each figure, and the goals
# per shape with their ratios — Q8_0 batch-1 decode >= 1.6x ringlm's own F32 (needs F32 and
# Q8_0 in --types); for each quantized type (Q8_0, Q4_K_M), at 32 sequences >= 1.2x llama.cpp's
# aggregate decode on the same file and at batch 1 >= 0.9x llama.cpp's — each "met" or "MISSED".
# F16 and Q4_K_M files come from ringlm-mkmodel's own writer and quantizers (Q4_K_M: llama.cpp's
# mix, as llama-quantize makes it of the F32 file). The load average is printed at the
# start and the end: figures taken on a busy machine are indicative only.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
SHAPES=stories15M TYPES=F32,F16,Q8_0,Q4_K_M THREADS=2 RUNS=3 KEEP=
LLAMA_BIN=${LLAMA_CPP_BIN:-/work/llama.cpp/build/bin}
usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --shapes) SHAPES=$2; shift 2 ;;
    --types) TYPES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --llama-bin) LLAMA_BIN=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    *) usage ;;
  esac
done
command -v jq >/dev/null || { echo "gguf_compare.sh: jq not found" >&2; exit 77; }
for p in "$B/perf/engine_bench" "$B/bin/ringlm-mkmodel"; do
  [ -x "$p" ] || { echo "gguf_compare.sh: $p not built (make)" >&2; exit 1; }
done
LB="$LLAMA_BIN/llama-batched-bench"
if [ -x "$LB" ]; then
  echo "llama.cpp: $LB"
else
  echo "llama.cpp: $LB not found — measuring ringlm alone (see the top of this script to build it)"
  LB=
fi

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
t0=$(date +%s)
dir=${KEEP:-$(mktemp -d)}
mkdir -p "$dir"
[ -n "$KEEP" ] || trap 'rm -rf "$dir"' EXIT

median() { sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
spread() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {if (NR == 0) print "-"; else printf "%.1f-%.1f", lo, hi}'; }

files=()
for shape in ${SHAPES//,/ }; do
  for type in ${TYPES//,/ }; do
    f="$dir/$shape-$type.gguf"
    if [ ! -s "$f" ]; then
      "$B/bin/ringlm-mkmodel" --model "synthetic:$shape:1" --format gguf --type "$type" \
        --placeholder-vocab --out "$f" \
        2> "$f.log" || { cat "$f.log" >&2; exit 1; }
      grep -q "note:" "$f.log" && echo "$shape $type: $(grep -o 'note:.*' "$f.log" | cut -c1-160)..."
    fi
    files+=("$f")
  done
done

for run in $(seq "$RUNS"); do
  for f in "${files[@]}"; do
    base=$(basename "$f" .gguf)
    "$B/perf/engine_bench" --model "$f" --threads "$THREADS" --context 32 --steps 128 \
      --seqs 1,8,32 --repeats 1 --no-naive --json >> "$dir/$base.ringlm.jsonl"
    if [ -n "$LB" ]; then
      extra=()
      case "$base" in *-Q8_0) extra=(--no-repack) ;; esac
      "$LB" -m "$f" -c 8192 -b 2048 -ub 512 -npp 32 -ntg 128 -npl 1,8,32 -t "$THREADS" \
        "${extra[@]}" --output-format jsonl 2>/dev/null | grep '^{' >> "$dir/$base.llama.jsonl" || {
        echo "gguf_compare.sh: llama-batched-bench failed on $f" >&2; }
    fi
  done
done

seen=$(cat "$dir/$(basename "${files[0]}" .gguf).ringlm.jsonl" 2>/dev/null | wc -l)
printf '\n%-22s | %-44s | %-30s | %s\n' "" "ringlm (medians of $seen runs, $THREADS thr.)" \
  "llama.cpp (same file, $THREADS thr.)" "ringlm / llama.cpp"
printf '%-22s | %7s %7s %7s %8s %5s %6s | %7s %7s %7s %6s | %5s %5s %5s\n' "file" "dec@1" "dec@8" \
  "dec@32" "prefill" "loadms" "RSSMiB" "dec@1" "dec@8" "dec@32" "pp" "@1" "@8" "@32"
f1() { case "$1" in -|""|null) echo - ;; *) printf '%.1f' "$1" ;; esac; }
ratio() { case "$1$2" in *-*|*null*|"") echo -; return ;; esac; awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
declare -A MED # MED[base:ringlm:N], MED[base:llama:N]: the medians, for the goals
spreads=()
for f in "${files[@]}"; do
  base=$(basename "$f" .gguf)
  r="$dir/$base.ringlm.jsonl" l="$dir/$base.llama.jsonl"
  rd=() ld=() rs=() ls=()
  for n in 1 8 32; do
    rd+=("$(jq -r ".decode_tok_s.\"$n\"" "$r" | median)")
    rs+=("$(jq -r ".decode_tok_s.\"$n\"" "$r" | spread)")
    if [ -s "$l" ]; then
      ld+=("$(jq -r "select(.pl == $n) | .speed_tg" "$l" | median)")
      ls+=("$(jq -r "select(.pl == $n) | .speed_tg" "$l" | spread)")
    else
      ld+=(-) ls+=(-)
    fi
    MED[$base:ringlm:$n]=${rd[-1]} MED[$base:llama:$n]=${ld[-1]}
  done
  pre=$(jq -r .prefill_tok_s "$r" | median)
  load=$(jq -r .load_ms "$r" | median)
  rss=$(jq -r .rss_mib "$r" | median)
  pp=-
  [ -s "$l" ] && pp=$(jq -r 'select(.pl == 1) | .speed_pp' "$l" | median)
  printf '%-22s | %7s %7s %7s %8s %5s %6s | %7s %7s %7s %6s | %5s %5s %5s\n' "$base" \
    "$(f1 "${rd[0]}")" "$(f1 "${rd[1]}")" "$(f1 "${rd[2]}")" "$(f1 "$pre")" "$(f1 "$load")" "$(f1 "$rss")" \
    "$(f1 "${ld[0]}")" "$(f1 "${ld[1]}")" "$(f1 "${ld[2]}")" "$(f1 "$pp")" \
    "$(ratio "${rd[0]}" "${ld[0]}")" "$(ratio "${rd[1]}" "${ld[1]}")" "$(ratio "${rd[2]}" "${ld[2]}")"
  spreads+=("$(printf '%-22s | %-13s %-13s %-13s | %-13s %-13s %-13s' "$base" "${rs[@]}" "${ls[@]}")")
done
echo "(prefill: ringlm's engine_bench prefill rows; pp: llama.cpp's 32-token prompt at 1 sequence)"

printf '\nspread over the runs (min-max decode tok/s)\n%-22s | %-13s %-13s %-13s | %-13s %-13s %-13s\n' \
  "file" "ringlm @1" "ringlm @8" "ringlm @32" "llama.cpp @1" "llama.cpp @8" "llama.cpp @32"
printf '%s\n' "${spreads[@]}"

printf '\ngoals, on the medians\n'
goal() { # label value want
  local v=$2
  if [ "$v" = - ]; then
    printf '  %-58s %6s  (not measured)\n' "$1" -
  else
    printf '  %-58s %6s  %s (goal >= %s)\n' "$1" "$v" \
      "$(awk -v v="$v" -v w="$3" 'BEGIN {print (v >= w) ? "met" : "MISSED"}')" "$3"
  fi
}
for shape in ${SHAPES//,/ }; do
  q=$shape-Q8_0 f=$shape-F32
  goal "$shape: Q8_0 / ringlm F32, decode at 1 sequence" \
    "$(ratio "${MED[$q:ringlm:1]:--}" "${MED[$f:ringlm:1]:--}")" 1.6
  for type in ${TYPES//,/ }; do # the llama.cpp goals, for each quantized type measured
    case "$type" in Q*) ;; *) continue ;; esac
    q=$shape-$type
    goal "$shape: $type / llama.cpp $type, aggregate decode at 32" \
      "$(ratio "${MED[$q:ringlm:32]:--}" "${MED[$q:llama:32]:--}")" 1.2
    goal "$shape: $type / llama.cpp $type, decode at 1 sequence" \
      "$(ratio "${MED[$q:ringlm:1]:--}" "${MED[$q:llama:1]:--}")" 0.9
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $(( $(date +%s) - t0 )) s"
