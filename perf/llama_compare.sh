#!/usr/bin/env bash
# llama_compare.sh — ringlm's engine against llama.cpp, side by side on the same GGUF files:
# decode tok/s at 1/4/8/16/32 sequences (32-token prompts, 128 generated tokens, logits for
# every sequence at every step, as llama-batched-bench counts them), prefill tok/s of one
# 256- and one 1024-token prompt (llama-bench -p against engine_bench --prefill), for each
# model shape and weight type, the same thread count; and through HTTP, ringlm-gateway +
# ringlmd against llama-server on the same file, measured by one client
# (perf/http_stream_bench: bursts of 1/8/32 concurrent streams of 128 tokens; TTFT p50,
# aggregate tok/s, and each stream's rate after its first token).
#
# For each shape and type a GGUF file is written with ringlm-mkmodel (synthetic weights from
# the preset); then, --runs times, ringlm and llama.cpp run one after the other on it (decode,
# then prefill; the HTTP servers in A B B A order), so load from other users of the machine
# hits both alike. The load average is recorded before and after every block and printed.
# perf/machine_probe runs before the first and after the last run: the memory read bandwidth,
# the f32 FMA peak, OpenBLAS's SGEMM rate (and the core it chose) of this machine now, and
# one core's products per cycle in FMAs, 8-bit integer dots and BF16 dots (machine_probe --mul).
# Prints per file the median of each figure with the lowest and highest run, ringlm/llama.cpp
# on the medians, and batch-1 decode as a share of the probed read bandwidth (the file's
# bytes read once per token).
# The read bandwidth of a VM moves between processes and over minutes, so the share is taken
# against probes of its own window: machine_probe --read runs just before and just after each
# file's decode block (ringlm's and llama.cpp's decode runs of that file in that run), and
# each run's batch-1 decode is put against the higher of its block's two probes (each the
# median of its fastest layout: an upper bound of what a reader like the engine gets), then
# the median over runs is printed with the lowest and highest run. The higher of the two,
# not their mean or the lower, so that a probe that caught the machine slow does not flatter
# the share; per run, not the median rate over the median probe, so that a fast run is not
# put against a slow window. Every block's probes are printed (its fastest layout's figure,
# and the simple figure of older results in parentheses). Prefill lengths beyond a model's
# context (stories15M: 256) are not run. --json writes one JSON object per file instead of
# the tables. HTTP runs for the types of --http-types (default F32; "none" skips it),
# --http-streams (default 1,8,32);
# --http-policy FILE runs that ringlmd with the policy FILE (default: its built-in policy).
# --arch A writes the files with that architecture (ringlm-mkmodel --arch; default llama, the
# files then named PRESET-TYPE.gguf, else PRESET-A-TYPE.gguf): for qwen3moe, whose decode row
# reads only the experts it picks, batch-1 decode is also put against the bytes of weights a
# row reads (engine_bench's active_weight_bytes: the router and n_expert_used experts of each
# layer, the classifier, one embedding row), printed where they differ from the file's size.
#
#   B=build perf/llama_compare.sh [--models stories15M,stories110M]
#          [--types F32,F16,BF16,Q8_0,Q4_K_M] [--seqs 1,4,8,16,32] [--prefill 256,1024]
#          [--http-types F32] [--http-streams 1,8,32] [--http-policy FILE] [--no-decode] [--no-prefill]
#          [--runs 3] [--threads 2] [--keep DIR] [--json] [--arch llama|qwen3moe|...]
#          [--llama-repack auto|on|off]
#
# llama.cpp: LLAMA_CPP_DIR (default /work/llama-build/build/bin) must hold llama-batched-bench,
# llama-bench and llama-server, built natively, outside this repository, from the source
# node-llama-cpp ships:
#   git clone tests/node/node_modules/node-llama-cpp/llama/gitRelease.bundle /work/llama-build/src
#   cmake -S /work/llama-build/src -B /work/llama-build/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
#         -DCMAKE_BUILD_TYPE=Release && cmake --build /work/llama-build/build -j2 \
#         --target llama-batched-bench llama-bench llama-server
# llama.cpp runs as it runs by default, its quantized weights repacked where it has kernels
# for that on this CPU (its fastest decode; --llama-repack on); where such a run fails (its
# AMX repack dies with SIGILL on VMs that report AMX without enabling it) the file's runs are
# done with --no-repack (--llama-repack auto, the default; LLAMA_REPACK in the environment
# too); --llama-repack off passes --no-repack for every quantized file (llama-bench of some
# versions has no such switch: the script says so and runs it as it is). Each file's table
# says which llama.cpp ran. Without a llama.cpp binary the script says which
# is missing, skips what needs it and measures ringlm alone (CI does not build llama.cpp).
# --keep DIR keeps the files there and reuses them. Needs jq and curl (exit 77 without them)
# and this tree built (make).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama-build/build/bin}
MODELS=stories15M,stories110M TYPES=F32,F16,BF16,Q8_0,Q4_K_M SEQS=1,4,8,16,32 PREFILL=256,1024
RUNS=3 THREADS=2 JSON=0 KEEP= ARCH=llama
HTTP_TYPES=F32 HTTP_STREAMS=1,8,32 HTTP_POLICY= DO_DECODE=1 DO_PREFILL=1
PROMPT=32 GEN=128
# --help (or anything it does not know) prints this header
usage() { awk 'NR > 1 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS=$2; shift 2 ;;
    --types|--type) TYPES=$2; shift 2 ;;
    --seqs) SEQS=$2; shift 2 ;;
    --prefill) PREFILL=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --http-types) HTTP_TYPES=$2; shift 2 ;;
    --http-streams) HTTP_STREAMS=$2; shift 2 ;;
    --http-policy) HTTP_POLICY=$2; shift 2 ;;
    --no-decode) DO_DECODE=0; shift ;;
    --no-prefill) DO_PREFILL=0; shift ;;
    --json) JSON=1; shift ;;
    --arch) ARCH=$2; shift 2 ;;
    --llama-repack) LLAMA_REPACK=$2; shift 2 ;;
    *) usage ;;
  esac
done
for t in jq curl; do
  command -v $t >/dev/null || { echo "llama_compare.sh: $t not found" >&2; exit 77; }
done
for p in bin/ringlm-mkmodel bin/ringlmd bin/ringlm-gateway perf/engine_bench perf/machine_probe \
         perf/http_stream_bench; do
  [ -x "$B/$p" ] || { echo "llama_compare.sh: $B/$p not built (make)" >&2; exit 1; }
done
LLAMA=$LLAMA_CPP_DIR/llama-batched-bench LLAMA_BENCH=$LLAMA_CPP_DIR/llama-bench
LLAMA_SERVER=$LLAMA_CPP_DIR/llama-server
missing() {
  echo "llama_compare.sh: $1 not found (LLAMA_CPP_DIR=$LLAMA_CPP_DIR; build it as this" \
       "script's header says): $2 measured for ringlm alone" >&2
}
have_llama=1 have_lbench=1 have_lserver=1
[ -x "$LLAMA" ] || { have_llama=0; missing "$LLAMA" "decode"; }
[ -x "$LLAMA_BENCH" ] || { have_lbench=0; missing "$LLAMA_BENCH" "prefill"; }
[ -x "$LLAMA_SERVER" ] || { have_lserver=0; missing "$LLAMA_SERVER" "HTTP"; }
lbench_nr=()
if [ "$have_lbench" = 1 ] && ! "$LLAMA_BENCH" --help 2>&1 | grep -q -- '--no-repack'; then
  lbench_nr=none
  echo "llama_compare.sh: this llama-bench has no --no-repack: its quantized prefill runs with" \
       "the weights repacked where llama.cpp repacks them on this CPU" >&2
fi
max_seqs=$(echo "$SEQS" | tr ',' '\n' | sort -n | tail -1)
max_pre=$(echo "$PREFILL" | tr ',' '\n' | sort -n | tail -1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=${KEEP:-$tmp}
mkdir -p "$dir"
cp "$B/perf/engine_bench" "$B/perf/machine_probe" "$tmp/" # a rebuild meanwhile disturbs nothing
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$tmp/load.log"
# mark BLOCK: the 1-minute load average now, into the log the summary prints
mark() { echo "$1 $(cut -d' ' -f1 /proc/loadavg)" >>"$tmp/load.log"; }
"$tmp/machine_probe" --threads "$THREADS" --repeats 3 --json >"$tmp/probe.jsonl"

files=()
arch_args=()
[ "$ARCH" = llama ] || arch_args=(--arch "$ARCH")
for preset in ${MODELS//,/ }; do
  for type in ${TYPES//,/ }; do
    f=$dir/$preset-$type.gguf
    [ "$ARCH" = llama ] || f=$dir/$preset-$ARCH-$type.gguf
    if [ ! -s "$f" ]; then
      "$B/bin/ringlm-mkmodel" --model "synthetic:$preset:1" --format gguf --type "$type" \
        "${arch_args[@]}" --placeholder-vocab --out "$f" >"$tmp/mkmodel.log" 2>&1 ||
        { cat "$tmp/mkmodel.log" >&2; echo "llama_compare.sh: cannot write $f" >&2; exit 1; }
    fi
    files+=("$f")
    base=$(basename "$f" .gguf)
    : >"$tmp/$base.ringlm.jsonl"
    : >"$tmp/$base.pre.jsonl"
    : >"$tmp/$base.llama.jsonl"
    : >"$tmp/$base.http.jsonl"
    : >"$tmp/$base.probe.jsonl"
  done
done

# probe_read RUN BASE before|after: the read bandwidth now (machine_probe --read), one line
# into BASE's block probes
probe_read() {
  "$tmp/machine_probe" --read --threads "$THREADS" --repeats 3 --json |
    jq -c --argjson run "$1" --arg when "$3" \
      '{run: $run, when: $when, best: .read_best.gb_s.median, layout: .read_best.layout,
        best_lowest: .read_best.gb_s.lowest, best_highest: .read_best.gb_s.highest,
        simple: .read_gb_s.median}' >>"$tmp/$2.probe.jsonl"
}

# HTTP: ringlmd + ringlm-gateway, or llama-server, on file $1 (perf/http_servers.sh), measured
# by http_stream_bench (one burst per stream count) into $2
. perf/http_servers.sh
http_ringlm() {
  local f=$1 out=$2 pol=()
  [ -z "$HTTP_POLICY" ] || pol=(--policy "$HTTP_POLICY")
  # room for every stream's prompt and tokens (blocks of 16), whatever the stream count
  http_start_ringlm "$f" "$tmp" $(( (max_http * (PROMPT + GEN + 16) + 15) / 16 + 64 )) "${pol[@]}" ||
    { echo "llama_compare.sh: ringlm-gateway did not come up on $f" >&2; exit 1; }
  "$B/perf/http_stream_bench" --port "$HTTP_PORT" --streams "$HTTP_STREAMS" --prompt-len "$PROMPT" \
    --max-tokens "$GEN" --runs 1 --label ringlm --json >>"$out" ||
    { stop_pids $HTTP_PIDS; echo "llama_compare.sh: http_stream_bench failed (ringlm)" >&2; exit 1; }
  stop_pids $HTTP_PIDS
}
http_llama() {
  local f=$1 out=$2
  http_start_llama "$f" "$tmp" "$max_http" $((max_http * (PROMPT + GEN + 8))) ||
    { echo "llama_compare.sh: llama-server did not come up on $f" >&2; exit 1; }
  "$B/perf/http_stream_bench" --port "$HTTP_PORT" --streams "$HTTP_STREAMS" --prompt-len "$PROMPT" \
    --max-tokens "$GEN" --runs 1 --label llama-server --json >>"$out" ||
    { stop_pids $HTTP_PIDS; echo "llama_compare.sh: http_stream_bench failed (llama-server)" >&2; exit 1; }
  stop_pids $HTTP_PIDS
}
max_http=$(echo "$HTTP_STREAMS" | tr ',' '\n' | sort -n | tail -1)

# llama_try FILE CMD...: run a llama.cpp tool on FILE with the file's repacking (extra: its
# --no-repack or nothing; nr_ok=0: this tool has no such switch), stdout into $tmp/llama.out;
# in auto mode a failed run with repacking is done again with --no-repack, and the file's
# later runs take it too ($tmp/BASE.norepack)
llama_try() {
  local f=$1 nr=()
  shift
  [ "$nr_ok" = 0 ] || nr=("${extra[@]}")
  "$@" "${nr[@]}" >"$tmp/llama.out" 2>"$tmp/llama.log" && return 0
  if [ "$LLAMA_REPACK" = auto ] && [ ${#extra[@]} = 0 ] && [ "$nr_ok" = 1 ] && llama_quantized "$f"
  then
    tail -3 "$tmp/llama.log" >&2
    echo "llama_compare.sh: llama.cpp failed repacking $f: its runs again with --no-repack" >&2
    extra=(--no-repack)
    touch "$tmp/$(basename "$f" .gguf).norepack"
    "$@" "${extra[@]}" >"$tmp/llama.out" 2>"$tmp/llama.log" && return 0
  fi
  tail -20 "$tmp/llama.log" >&2
  return 1
}

for r in $(seq "$RUNS"); do
  for f in "${files[@]}"; do
    base=$(basename "$f" .gguf)
    extra=()
    if llama_quantized "$f" && { [ "$LLAMA_REPACK" = off ] || [ -e "$tmp/$base.norepack" ]; }; then
      extra=(--no-repack)
    fi
    if [ "$DO_DECODE" = 1 ]; then
      probe_read "$r" "$base" before
      mark "run$r $base decode ringlm: before"
      "$tmp/engine_bench" --model "$f" --threads "$THREADS" --context "$PROMPT" --steps "$GEN" \
        --seqs "$SEQS" --repeats 1 --no-naive --json |
        jq -c --argjson run "$r" '. + {run: $run}' >>"$tmp/$base.ringlm.jsonl"
      mark "run$r $base decode ringlm: after"
      if [ "$have_llama" = 1 ]; then
        # every sequence count in one process; each sequence has its own prompt (not shared)
        ctx=$((max_seqs * (PROMPT + GEN)))
        mark "run$r $base decode llama.cpp: before"
        nr_ok=1
        llama_try "$f" "$LLAMA" -m "$f" -t "$THREADS" -c "$ctx" -b 2048 -ub 512 -npp "$PROMPT" \
          -ntg "$GEN" -npl "$SEQS" --output-format jsonl ||
          { echo "llama_compare.sh: llama-batched-bench failed on $f" >&2; exit 1; }
        grep '^{' "$tmp/llama.out" | jq -c --argjson run "$r" '{kind: "tg", pl, v: .speed_tg, run: $run}' \
          >>"$tmp/$base.llama.jsonl"
        mark "run$r $base decode llama.cpp: after"
      fi
      probe_read "$r" "$base" after
    fi
    if [ "$DO_PREFILL" = 1 ]; then
      mark "run$r $base prefill ringlm: before"
      for p in ${PREFILL//,/ }; do
        "$tmp/engine_bench" --model "$f" --threads "$THREADS" --context 1 --steps 1 --seqs 1 \
          --prefill "$p" --repeats 1 --no-naive --json |
          jq -c --argjson want "$p" 'select(.prefill_len == $want)
                                     | {pp: .prefill_len, tok_s: .prefill_tok_s}' \
          >>"$tmp/$base.pre.jsonl"
      done
      mark "run$r $base prefill ringlm: after"
      # prefill: llama-bench -p, only the lengths ringlm ran (within the model's context)
      pps=$(jq -r '.pp' "$tmp/$base.pre.jsonl" | sort -un | paste -sd, -)
      if [ "$have_lbench" = 1 ] && [ -n "$pps" ]; then
        nr_ok=1
        [ "$lbench_nr" = none ] && nr_ok=0
        mark "run$r $base prefill llama.cpp: before"
        llama_try "$f" "$LLAMA_BENCH" -m "$f" -t "$THREADS" -p "$pps" -n 0 -r 1 -o jsonl ||
          { echo "llama_compare.sh: llama-bench failed on $f" >&2; exit 1; }
        grep '^{' "$tmp/llama.out" | jq -c '{kind: "pp", pp: .n_prompt, v: .avg_ts}' \
          >>"$tmp/$base.llama.jsonl"
        mark "run$r $base prefill llama.cpp: after"
      fi
    fi
    # HTTP for the types asked, the two servers in A B B A order over the runs
    t=${base##*-}
    if [ "$HTTP_TYPES" != none ] && [[ ",$HTTP_TYPES," == *",$t,"* ]]; then
      for side in $( [ $((r % 2)) = 1 ] && echo "ringlm llama" || echo "llama ringlm"); do
        if [ "$side" = ringlm ]; then
          mark "run$r $base http ringlm: before"
          http_ringlm "$f" "$tmp/$base.http.jsonl"
          mark "run$r $base http ringlm: after"
        elif [ "$have_lserver" = 1 ]; then
          mark "run$r $base http llama-server: before"
          http_llama "$f" "$tmp/$base.http.jsonl"
          mark "run$r $base http llama-server: after"
        fi
      done
    fi
  done
done
"$tmp/machine_probe" --threads "$THREADS" --repeats 3 --json >>"$tmp/probe.jsonl"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

probe=$(jq -s '{cpu_features: .[0].cpu_features, openblas_core: .[0].openblas_core,
                read_best_gb_s: [.[].read_best.gb_s.median], read_best_layout: [.[].read_best.layout],
                read_gb_s: [.[].read_gb_s.median], fma_gflop_s: [.[].fma_f32_gflop_s.median],
                sgemm_gflop_s: [.[].sgemm_1024_gflop_s.median],
                sgemm_prefill_1thread_gflop_s: [.[].sgemm_256x768x768_1thread_gflop_s.median],
                mul: [.[].mul_probe // empty | .products_per_cycle]}' \
  "$tmp/probe.jsonl")
if [ "$JSON" = 0 ]; then
  echo "$probe" | jq -r '"machine (probed before and after the runs): \(.cpu_features); OpenBLAS core \(.openblas_core)",
    "  read \(.read_best_gb_s | map(tostring) | join(" / ")) GB/s (fastest layout: \(.read_best_layout | join(" / "))); simple read \(.read_gb_s | map(tostring) | join(" / ")) GB/s;",
    "  f32 FMA peak \(.fma_gflop_s | map(tostring) | join(" / ")) GFLOP/s;",
    "  SGEMM 1024^3 \(.sgemm_gflop_s | map(tostring) | join(" / ")) GFLOP/s; 256x768x768 on 1 thread \(.sgemm_prefill_1thread_gflop_s | map(tostring) | join(" / ")) GFLOP/s",
    (if (.mul | length) > 0 then "  products per cycle, 1 thread: f32 FMA \(.mul | map(.fma_f32 | tostring) | join(" / ")); 8-bit dot (maddubs+madd) \(.mul | map(.dot8 | tostring) | join(" / ")); bf16 dot (vdpbf16ps, 0 without it) \(.mul | map(.bf16 // 0 | tostring) | join(" / "))" else empty end)'
  echo "load average: $load_start at the start, $load_end at the end ($(nproc) CPUs)"
  # the 1-minute load before and after each block: its range per side
  awk '{ side = ($0 ~ /ringlm:/) ? "ringlm" : "llama.cpp"; v = $NF + 0
         n[side]++; s[side] += v
         if (!(side in lo) || v < lo[side]) lo[side] = v; if (v > hi[side]) hi[side] = v }
       END { for (k in n) printf "  1-minute load at the %s blocks: %.2f to %.2f (mean %.2f, %d readings)\n",
                                 k, lo[k], hi[k], s[k] / n[k], n[k] }' "$tmp/load.log"
  [ -z "$KEEP" ] || cp "$tmp/load.log" "$dir/load.log"
fi

for f in "${files[@]}"; do
  base=$(basename "$f" .gguf)
  bytes=$(stat -L -c %s "$f")
  repack="as by default"
  if llama_quantized "$f"; then
    repack="as by default (weights repacked where llama.cpp repacks this type on this CPU)"
    if [ "$LLAMA_REPACK" = off ] || [ -e "$tmp/$base.norepack" ]; then repack="--no-repack"; fi
  fi
  summary=$(jq -n --slurpfile r "$tmp/$base.ringlm.jsonl" --slurpfile p "$tmp/$base.pre.jsonl" \
    --slurpfile l "$tmp/$base.llama.jsonl" --argjson probe "$probe" --arg file "$base" \
    --slurpfile h "$tmp/$base.http.jsonl" --slurpfile b "$tmp/$base.probe.jsonl" \
    --argjson threads "$THREADS" --arg seqs "$SEQS" \
    --arg prefill "$PREFILL" --argjson prompt "$PROMPT" --argjson gen "$GEN" \
    --argjson bytes "$bytes" --argjson runs "$RUNS" --arg repack "$repack" '
    def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                       else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def r1: . * 10 | round / 10;
    def r2: . * 100 | round / 100;
    def stats: if length == 0 then null
               else {median: (median | r1), lowest: (min | r1), highest: (max | r1)} end;
    def stats2: if length == 0 then null
                else {median: (median | r2), lowest: (min | r2), highest: (max | r2)} end;
    def ratio($a; $b): if $a == null or $b == null then null
                       else (($a.median / $b.median) * 100 | round) / 100 end;
    ($seqs | split(",")) as $ks | ($prefill | split(",")) as $ps
    | (reduce $ks[] as $k ({}; .[$k] = ([$r[].decode_tok_s[$k]] | stats))) as $rd
    | (reduce $ps[] as $q ({}; .[$q] = ([$p[] | select(.pp == ($q | tonumber)) | .tok_s] | stats)))
        as $rp
    | (reduce $ks[] as $k ({}; .[$k] = ([$l[] | select(.kind == "tg" and .pl == ($k | tonumber))
                                         | .v] | stats))) as $ld
    | (reduce $ps[] as $q ({}; .[$q] = ([$l[] | select(.kind == "pp" and .pp == ($q | tonumber))
                                         | .v] | stats))) as $lp
    | ([$h[].streams] | unique) as $hs
    | (reduce $hs[] as $n ({}; .[$n | tostring] =
         (reduce ("ringlm", "llama-server") as $side ({}; .[$side] =
            ([$h[] | select(.streams == $n and .label == $side)] as $x
             | if ($x | length) == 0 then null
               else {ttft_p50_ms: ([$x[].ttft_p50_ms] | stats),
                     agg_tok_s: ([$x[].agg_tok_s.median] | stats),
                     stream_tok_s: ([$x[].stream_tok_s.median | select(. != null)] | stats),
                     short_streams: ([$x[].short_streams] | add)} end))
          | .ttft_ratio = ratio(.ringlm.ttft_p50_ms; .["llama-server"].ttft_p50_ms)
          | .agg_ratio = ratio(.ringlm.agg_tok_s; .["llama-server"].agg_tok_s)
          | .stream_ratio = ratio(.ringlm.stream_tok_s; .["llama-server"].stream_tok_s)))) as $http
    | ([$b[].run] | unique | map(. as $k | [$b[] | select(.run == $k)] as $x
         | {run: $k, before: ([$x[] | select(.when == "before")] | first // null),
            after: ([$x[] | select(.when == "after")] | first // null),
            bw: ([$x[].best] | max)})) as $blocks
    # per run: batch-1 decode reading $w bytes a token, against the higher probe of the block
    | def ringlm_shares($w): [$blocks[] as $k | $r[] | select(.run == $k.run)
                              | .decode_tok_s["1"] // empty | . * $w / 1e9 / $k.bw];
      def llama_shares($w): [$blocks[] as $k | $l[]
                             | select(.kind == "tg" and .pl == 1 and .run == $k.run)
                             | .v * $w / 1e9 / $k.bw];
      ([$r[].active_weight_bytes | select(. != null)] | first // null) as $act
    | ([$r[].n_expert | select(. != null)] | first // 0) as $nexp
    | {file: $file, threads: $threads, runs: $runs, prompt: $prompt, generated: $gen,
       file_bytes: $bytes, llama_cpp_weights: $repack,
       decode: {ringlm: $rd, llama_cpp: $ld,
                ratio: (if $ld == null then null
                        else reduce $ks[] as $k ({}; .[$k] = ratio($rd[$k]; $ld[$k])) end)},
       prefill: {ringlm: $rp, llama_cpp: $lp,
                 ratio: (if $lp == null then null
                         else reduce $ps[] as $q ({}; .[$q] = ratio($rp[$q]; $lp[$q])) end)},
       probe_blocks: $blocks,
       batch1_read_share: {ringlm: (ringlm_shares($bytes) | stats2 | .median),
                           llama_cpp: (llama_shares($bytes) | stats2 | .median)},
       batch1_read_share_runs: {ringlm: (ringlm_shares($bytes) | stats2),
                                llama_cpp: (llama_shares($bytes) | stats2)},
       active_weight_bytes: $act, n_expert: $nexp,
       batch1_active_read_share: {
         ringlm: (if $act == null then null else ringlm_shares($act) | stats2 | .median end),
         llama_cpp: (if $act == null then null else llama_shares($act) | stats2 | .median end)},
       batch1_active_read_share_runs: {
         ringlm: (if $act == null then null else ringlm_shares($act) | stats2 end),
         llama_cpp: (if $act == null then null else llama_shares($act) | stats2 end)},
       http: $http, probe: $probe}')
  if [ "$JSON" = 1 ]; then
    echo "$summary" | jq -c .
    continue
  fi
  echo "$summary" | jq -r '
    def cell: if . == null then "(not run)" else "\(.median) [\(.lowest), \(.highest)]" end;
    def pad($n): . + " " * ([$n - length, 0] | max);
    "",
    "\(.file): \(.threads) threads, \(.runs) runs each; tok/s median [lowest, highest]; llama.cpp \(.llama_cpp_weights)",
    "             ringlm                        llama.cpp                     ringlm/llama.cpp",
    (.decode as $d | $d.ringlm | keys_unsorted[] as $k
     | select($d.ringlm[$k] != null)
     | ("decode @" + $k | pad(12)) + " " + ($d.ringlm[$k] | cell | pad(29)) + " "
       + ((if $d.llama_cpp == null then null else $d.llama_cpp[$k] end) | cell | pad(29)) + " "
       + (if $d.ratio == null or $d.ratio[$k] == null then "-" else "\($d.ratio[$k])x" end)),
    (.prefill as $d | $d.ringlm | keys_unsorted[] as $k
     | select($d.ringlm[$k] != null)
     | ("prefill " + $k | pad(12)) + " " + ($d.ringlm[$k] | cell | pad(29)) + " "
       + ((if $d.llama_cpp == null then null else $d.llama_cpp[$k] end) | cell | pad(29)) + " "
       + (if $d.ratio == null or $d.ratio[$k] == null then "-" else "\($d.ratio[$k])x" end)),
    def share: if . == null then "-" else "\(.median) [\(.lowest), \(.highest)]" end;
    (select((.probe_blocks | length) > 0)
     | "read GB/s probed around each decode block, fastest layout before / after (simple):",
       "  " + (.probe_blocks | map("run \(.run) \(.before.best // "-") / \(.after.best // "-")"
                                   + " (\(.before.simple // "-") / \(.after.simple // "-"))")
               | join("; "))),
    (select(.decode.ringlm["1"] != null)
     | "batch-1 decode reads the file (\(.file_bytes / 1e6 | round) MB) at \(.batch1_read_share_runs.ringlm | share)"
       + " of the probed read bandwidth (llama.cpp \(.batch1_read_share_runs.llama_cpp | share));"
       + " each run against the higher probe of its block"),
    (select(.decode.ringlm["1"] != null and .active_weight_bytes != null
            and (.n_expert > 0 or ((.active_weight_bytes - .file_bytes) | if . < 0 then -. else . end) > 0.05 * .file_bytes))
     | "batch-1 decode reads the weights a row needs (\(.active_weight_bytes / 1e6 | round) MB"
       + (if .n_expert > 0 then ", its experts only" else "" end)
       + ") at \(.batch1_active_read_share_runs.ringlm | share) of the probed read bandwidth"
       + " (llama.cpp \(.batch1_active_read_share_runs.llama_cpp | share))"),
    (select(.http != {})
     | "HTTP, \(.prompt)-token prompts, \(.generated) tokens a stream, bursts of N streams; median [lowest, highest] over runs",
       "             ringlm-gateway                llama-server                  ringlm/llama-server",
       (.http as $H | $H | keys_unsorted | sort_by(tonumber)[] as $n | $H[$n] as $x
        | ("TTFT p50 ms @" + $n | pad(14)) + " " + ($x.ringlm.ttft_p50_ms | cell | pad(29)) + " "
          + ($x["llama-server"].ttft_p50_ms | cell | pad(29)) + " "
          + (if $x.ttft_ratio == null then "-" else "\($x.ttft_ratio)x" end),
          ("agg tok/s @" + $n | pad(14)) + " " + ($x.ringlm.agg_tok_s | cell | pad(29)) + " "
          + ($x["llama-server"].agg_tok_s | cell | pad(29)) + " "
          + (if $x.agg_ratio == null then "-" else "\($x.agg_ratio)x" end),
          ("stream tok/s @" + $n | pad(14)) + " " + ($x.ringlm.stream_tok_s | cell | pad(29)) + " "
          + ($x["llama-server"].stream_tok_s | cell | pad(29)) + " "
          + (if $x.stream_ratio == null then "-" else "\($x.stream_ratio)x" end)
          + (if (($x.ringlm.short_streams // 0) + ($x["llama-server"].short_streams // 0)) > 0
             then "  (streams with fewer events than tokens: ringlm \($x.ringlm.short_streams // 0),"
                  + " llama-server \($x["llama-server"].short_streams // 0))" else "" end)))'
done
