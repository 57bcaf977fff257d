#!/usr/bin/env bash
# http_single.sh — one stream's decode rate three ways, side by side on one model file: the
# engine alone (engine_bench, one sequence), ringlmd through its client library (`ringlm
# generate --stats`, one session) and ringlmd through ringlm-gateway over HTTP
# (http_stream_bench, one stream), each a P-token prompt and G tokens, greedy. The rate is
# the one after the first token (G - 1 tokens over first to last token), so the prompt's
# prefill and the connection's set-up are not in it: what is lost between engine and client
# per token. The three take turns in each run (engine, library, HTTP, then HTTP, library,
# engine), on one ringlmd and one gateway started once, so load from other users of the
# machine reaches all alike; prints per run each rate and the ratios to the engine of the
# same run, then their medians with the lowest and highest run, and the 1-minute load
# before and after.
#
#   B=build perf/http_single.sh --model FILE [--threads 2] [--runs 5] [--prompt-len 32]
#                               [--tokens 128] [--json] [-- ringlmd options]
# Needs jq and curl; exit 77 when either is missing.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
MODEL= THREADS=2 RUNS=5 PROMPT=32 GEN=128 JSON=0
usage() {
  echo "usage: perf/http_single.sh --model FILE [--threads 2] [--runs 5] [--prompt-len 32]" \
       "[--tokens 128] [--json] [-- ringlmd options]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --prompt-len) PROMPT=$2; shift 2 ;;
    --tokens) GEN=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ -n "$MODEL" ] || usage
for t in jq curl; do
  command -v $t >/dev/null || { echo "http_single.sh: $t not found" >&2; exit 77; }
done
for b in bin/ringlmd bin/ringlm-gateway bin/ringlm perf/engine_bench perf/http_stream_bench; do
  [ -x "$B/$b" ] || { echo "http_single.sh: $B/$b not built (make)" >&2; exit 1; }
done

tmp=$(mktemp -d)
dpid= gpid=
cleanup() {
  for p in $gpid $dpid; do kill "$p" 2>/dev/null || true; done
  for p in $gpid $dpid; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

sock=$tmp/d.sock
"$B/bin/ringlmd" --socket "$sock" --numa-node off --model "$MODEL" --threads "$THREADS" \
  --kv-blocks $(( (PROMPT + GEN + 15) / 16 + 64 )) --quiet "$@" >"$tmp/ringlmd.log" 2>&1 &
dpid=$!
for _ in $(seq 600); do [ -S "$sock" ] && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
"$B/bin/ringlm-gateway" --listen 127.0.0.1:0 --socket "$sock" --tokenizer "$MODEL" --quiet \
  >"$tmp/gateway.log" 2>&1 &
gpid=$!
port=
for _ in $(seq 600); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/gateway.log" | head -1)
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$gpid" 2>/dev/null || break
  sleep 0.1
done
curl -sf "http://127.0.0.1:${port:-0}/health" >/dev/null 2>&1 || {
  tail -5 "$tmp/ringlmd.log" "$tmp/gateway.log" >&2
  echo "http_single.sh: ringlmd + ringlm-gateway did not come up on $MODEL" >&2
  exit 1
}

engine() {
  "$B/perf/engine_bench" --model "$MODEL" --threads "$THREADS" --seqs 1 --context "$PROMPT" \
    --steps "$GEN" --repeats 1 --no-naive --json | jq -r '.decode_tok_s["1"]'
}
# a prompt of distinct ids per run, so that no run is served from the prefix cache
ids() { seq "$1" "$2" $(( $1 + $2 * (PROMPT - 1) )) | paste -sd, -; }
library() {
  "$B/bin/ringlm" --socket "$sock" generate --prompt-ids "$(ids $(( 100 + $1 )) 37)" \
    --max-tokens "$GEN" --ignore-stop --stats 2>&1 >/dev/null |
    sed -n 's/.*, \([0-9.]*\) ms\/token,.*/\1/p' | awk 'NR == 1 && $1 > 0 { printf "%.2f", 1000 / $1 }'
}
http() {
  "$B/perf/http_stream_bench" --port "$port" --streams 1 --prompt-len "$PROMPT" \
    --max-tokens "$GEN" --runs 1 --json | jq -r '.stream_tok_s.median'
}

: >"$tmp/runs.jsonl"
for r in $(seq "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then
    e=$(engine); l=$(library "$r"); h=$(http)
  else
    h=$(http); l=$(library "$r"); e=$(engine)
  fi
  for v in "$e" "$l" "$h"; do
    case "$v" in '' | *[!0-9.]*) echo "http_single.sh: run $r gave no rate (engine '$e', library '$l', HTTP '$h')" >&2; exit 1 ;; esac
  done
  echo "{\"run\":$r,\"engine\":$e,\"library\":$l,\"http\":$h}" >>"$tmp/runs.jsonl"
  [ "$JSON" = 1 ] || printf 'run %d: engine %.1f, library %.1f (%.3fx), HTTP %.1f (%.3fx) tok/s\n' \
    "$r" "$e" "$l" "$(echo "$l / $e" | bc -l)" "$h" "$(echo "$h / $e" | bc -l)"
done

jq -n --slurpfile r "$tmp/runs.jsonl" --arg model "$MODEL" --argjson threads "$THREADS" \
  --argjson prompt "$PROMPT" --argjson gen "$GEN" --arg lb "$load_before" \
  --arg la "$(cut -d' ' -f1-3 /proc/loadavg)" '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def st: {median: (median * 1000 | round / 1000), lowest: min, highest: max};
  {model: $model, threads: $threads, prompt: $prompt, tokens: $gen, runs: ($r | length),
   load_before: $lb, load_after: $la,
   engine_tok_s: ([$r[].engine] | st), library_tok_s: ([$r[].library] | st),
   http_tok_s: ([$r[].http] | st),
   library_vs_engine: ([$r[] | .library / .engine] | st),
   http_vs_engine: ([$r[] | .http / .engine] | st)}' >"$tmp/summary.json"
if [ "$JSON" = 1 ]; then
  jq -c . "$tmp/summary.json"
else
  jq -r '
    def f: "\(.median * 10 | round / 10) [\(.lowest * 10 | round / 10), \(.highest * 10 | round / 10)]";
    def x: "\(.median * 1000 | round / 1000)x [\(.lowest * 1000 | round / 1000), \(.highest * 1000 | round / 1000)]";
    "http_single \(.model), \(.threads) threads, \(.prompt)-token prompt, \(.tokens) tokens, \(.runs) runs; load \(.load_before) -> \(.load_after)",
    "decode tok/s after the first token, median [lowest, highest] run:",
    "  engine alone      \(.engine_tok_s | f)",
    "  ringlmd, library  \(.library_tok_s | f)   per-run ratio to the engine \(.library_vs_engine | x)",
    "  ringlmd, HTTP     \(.http_tok_s | f)   per-run ratio to the engine \(.http_vs_engine | x)"' \
    "$tmp/summary.json"
fi
