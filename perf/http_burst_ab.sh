#!/usr/bin/env bash
# http_burst_ab.sh — bursts of concurrent streams through ringlm-gateway + ringlmd, under the
# built-in policy and under each --policy NAME=FILE, and through llama-server, on one GGUF
# file, measured by one client (perf/http_stream_bench: bursts of --streams concurrent
# completions, --prompt-len token ids each, --tokens generated, greedy, ignore_eos), side by
# side: every round runs every server once (a fresh process each), the order reversed every
# other round, so load from other users of the machine reaches all alike. Each server gets
# one short warm-up stream first (its weights paged in), not counted.
#
# Prints per server and stream count the TTFT p50 and the aggregate tok/s, medians over the
# rounds with the lowest and highest, and each ringlm setting's ratio to llama-server on the
# medians (TTFT: ringlm / llama-server, lower is better; aggregate: higher is better) and,
# with two rounds or more, the median [lowest, highest] of its ratios within each round (the
# two servers' blocks of one round ran minutes apart, not the whole run: on a loaded machine
# those are the ratios to read); then,
# for every ringlm run, which engine steps prefilled each burst (ringlmd's iteration log):
# [prompts, prefill tokens, decode rows, step ms] per step that prefilled, the load (1-minute)
# before every block.
#
#   B=build perf/http_burst_ab.sh --model FILE [--policy NAME=FILE]... [--streams 1,8,32]
#        [--rounds 2] [--prompt-len 32] [--tokens 128] [--threads 2] [--no-llama]
#        [--keep DIR]
#
# llama-server: LLAMA_CPP_DIR (default /work/llama-build/build/bin), started as llama_compare.sh
# starts it (perf/http_servers.sh: -np the largest stream count, a context that holds every
# stream, llama.cpp's weights repacked as by default: LLAMA_REPACK=auto|on|off; each of its
# load lines says "llama.cpp default" or "llama.cpp no-repack", what that start ran with);
# without it (or with --no-llama) only ringlm runs. Needs jq and curl (exit 77 without them).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama-build/build/bin}
MODEL= STREAMS=1,8,32 ROUNDS=2 PROMPT=32 GEN=128 THREADS=2 KEEP= LLAMA=1
POLICIES=("builtin=")
usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --policy) POLICIES+=("$2"); shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --prompt-len) PROMPT=$2; shift 2 ;;
    --tokens) GEN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --no-llama) LLAMA=0; shift ;;
    --keep) KEEP=$2; shift 2 ;;
    *) usage ;;
  esac
done
[ -n "$MODEL" ] && [ -f "$MODEL" ] || usage
for t in jq curl; do command -v $t >/dev/null || { echo "http_burst_ab.sh: needs $t" >&2; exit 77; }; done
LLAMA_SERVER=$LLAMA_CPP_DIR/llama-server
if [ "$LLAMA" = 1 ] && [ ! -x "$LLAMA_SERVER" ]; then
  echo "http_burst_ab.sh: no $LLAMA_SERVER: ringlm alone" >&2
  LLAMA=0
fi
tmp=${KEEP:-$(mktemp -d)}
mkdir -p "$tmp"
[ -n "$KEEP" ] || trap 'rm -rf "$tmp"' EXIT
max=$(echo "$STREAMS" | tr ',' '\n' | sort -n | tail -1)
load() { cut -d' ' -f1 /proc/loadavg; }

. perf/http_servers.sh
bench() { # port label out round: a warm-up stream (the weights paged in, not counted; 8
  # tokens, so that no whole 16-token block of the bursts' prompts is cached by it), the bursts
  "$B/perf/http_stream_bench" --port "$1" --streams 1 --prompt-len 8 --max-tokens 4 \
    --runs 1 >/dev/null || return 1
  "$B/perf/http_stream_bench" --port "$1" --streams "$STREAMS" --prompt-len "$PROMPT" \
    --max-tokens "$GEN" --runs 1 --label "$2" --json >"$tmp/bench.jsonl" || return 1
  jq -c --argjson r "$4" '. + {round: $r}' "$tmp/bench.jsonl" >>"$3"
}

run_ringlm() { # name policy-file round
  local name=$1 pf=$2 r=$3 pol=()
  [ -z "$pf" ] || pol=(--policy "$pf")
  http_start_ringlm "$MODEL" "$tmp" $(( (max * (PROMPT + GEN + 16) + 15) / 16 + 64 )) "${pol[@]}" \
    --iteration-log "$tmp/it.$name.$r.jsonl" --request-log "$tmp/rq.$name.$r.jsonl" ||
    { echo "http_burst_ab.sh: ringlm ($name) did not come up" >&2; exit 1; }
  echo "round $r ringlm $name: load $(load)" >>"$tmp/loads"
  bench "$HTTP_PORT" "$name" "$tmp/results.jsonl" "$r" || { stop_pids $HTTP_PIDS; exit 1; }
  stop_pids $HTTP_PIDS
}

run_llama() { # round
  http_start_llama "$MODEL" "$tmp" "$max" $((max * (PROMPT + GEN + 8))) ||
    { echo "http_burst_ab.sh: llama-server did not come up" >&2; exit 1; }
  echo "round $1 llama-server (llama.cpp $LLAMA_REPACK_USED): load $(load)" >>"$tmp/loads"
  bench "$HTTP_PORT" llama-server "$tmp/results.jsonl" "$1" || { stop_pids $HTTP_PIDS; exit 1; }
  stop_pids $HTTP_PIDS
}

: >"$tmp/results.jsonl"
: >"$tmp/loads"
order=()
[ "$LLAMA" = 1 ] && order+=(llama)
order+=("${POLICIES[@]}")
for r in $(seq "$ROUNDS"); do
  seq_=("${order[@]}")
  if [ $((r % 2)) = 0 ]; then
    seq_=()
    for ((i = ${#order[@]} - 1; i >= 0; i--)); do seq_+=("${order[$i]}"); done
  fi
  for s in "${seq_[@]}"; do
    if [ "$s" = llama ]; then run_llama "$r"; else run_ringlm "${s%%=*}" "${s#*=}" "$r"; fi
  done
done

echo "http_burst_ab.sh: $(basename "$MODEL"), $ROUNDS rounds, streams $STREAMS, prompts of $PROMPT tokens, $GEN generated; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs"
jq -rs --arg gen "$GEN" '
  def med: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r1: . * 10 | round / 10;
  def r2: . * 100 | round / 100;
  group_by(.streams)[] as $g
  | ($g | group_by(.label) | map({key: .[0].label,
       value: {ttft: (map(.ttft_p50_ms) | {m: med, lo: min, hi: max}),
               agg: (map(.agg_tok_s.median) | {m: med, lo: min, hi: max})}}) | from_entries) as $s
  | "streams \($g[0].streams)",
    ($s | to_entries[] | "  \(.key | .[0:14] | . + " " * (14 - length))"
       + "  TTFT p50 \(.value.ttft.m | r1) ms [\(.value.ttft.lo | r1), \(.value.ttft.hi | r1)]"
       + "  agg \(.value.agg.m | r1) tok/s [\(.value.agg.lo | r1), \(.value.agg.hi | r1)]"
       + (if $s["llama-server"] and .key != "llama-server" then
            "  vs llama-server: TTFT \(.value.ttft.m / $s["llama-server"].ttft.m | r2)x"
            + ", agg \(.value.agg.m / $s["llama-server"].agg.m | r2)x"
            + (.key as $k | [$g[] | select(.label == $k)] as $mine
               | [$mine[] | .round as $r | ($g[] | select(.label == "llama-server" and .round == $r))
                  as $l | {t: (.ttft_p50_ms / $l.ttft_p50_ms), a: (.agg_tok_s.median / $l.agg_tok_s.median)}]
               | if length > 1 then
                   "; within a round TTFT \(map(.t) | med | r2)x [\(map(.t) | min | r2), \(map(.t) | max | r2)]"
                   + ", agg \(map(.a) | med | r2)x [\(map(.a) | min | r2), \(map(.a) | max | r2)]"
                 else "" end)
          else "" end))' "$tmp/results.jsonl"
echo "loads (1-minute) before each block:"
sed 's/^/  /' "$tmp/loads"
echo "steps that prefilled each burst, [prompts, prefill tokens, decode rows, ms] (ringlmd's"
echo "iteration log), and when its first tokens came, ms from its first request read (request log):"
for f in "$tmp"/it.*.jsonl; do
  [ -f "$f" ] || continue
  n=${f#"$tmp"/it.}
  n=${n%.jsonl}
  # requests in arrival order: the warm-up, then each burst's
  jq -rn --arg streams "$STREAMS" --arg name "$n" \
    --slurpfile it "$f" --slurpfile rq "$tmp/rq.$n.jsonl" '
    ([1] + ($streams | split(",") | map(tonumber))) as $b
    | ($rq | sort_by(.arrival_us)) as $r
    | range(1; $b | length) as $k
    | ($b[0:$k] | add) as $off
    | $r[$off:$off + $b[$k]] as $g
    | ($g | map(.arrival_us) | min) as $t0
    | ($g | map(.first_token_us) | max) as $t1
    | [$it[] | select(.prefill_seqs > 0 and .t_us >= $t0 and .t_us <= $t1)
       | [.prefill_seqs, .prefill_tokens, .decode_seqs, (.exec_us / 100 | round / 10)]] as $steps
    | ($g | map((.first_token_us - $t0) / 100 | round / 10) | sort) as $ft
    | "  \($name) @\($b[$k]): \($steps | map(tostring) | join(" "))"
      + "  first tokens \($ft[0]) .. \($ft[($ft | length - 1) / 2 | floor]) (p50) .. \($ft[-1])"'
done
