#!/usr/bin/env bash
# The main job (`make demo`): start ringlmd on a model, run two tenants' short chats and one
# long prompt concurrently, stream one chat to the terminal, print the per-tenant summary,
# where the logs and metrics are, and stop the daemon (always: a trap stops it on any exit).
#
#   B=build scripts/demo.sh            (make demo sets B)
#   RINGLM_SHARED=../shared            where models/stories260K.bin and tok512.bin live
#   DEMO_KEEP=1                        keep the log folder (it is kept anyway; printed)
#
# Without stories260K it serves a synthetic model of the same shape (its text is noise, so
# token ids are shown). Until ringlmd serves models it runs the transport echo demo.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
BIN=$B/bin
SHARED=${RINGLM_SHARED:-../shared}
RINGLMD=$BIN/ringlmd
RINGLM=$BIN/ringlm

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

[ -x "$RINGLMD" ] || die "$RINGLMD not built (run: make B=$B)"
[ -x "$RINGLM" ] || die "$RINGLM not built (run: make B=$B)"

work=$(mktemp -d /tmp/ringlm-demo.XXXXXX)
sock=$work/ringlmd.sock
daemon_pid=
gateway_pid=
client_pids=()

cleanup() {
  local rc=$?
  for p in "${client_pids[@]}"; do kill "$p" 2>/dev/null; done
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -TERM "$gateway_pid" 2>/dev/null # drains, exits 0
    for _ in $(seq 100); do kill -0 "$gateway_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$gateway_pid" 2>/dev/null
    wait "$gateway_pid" 2>/dev/null
  fi
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$daemon_pid" 2>/dev/null; then
      echo "demo: ringlmd did not drain within 10 s; killing it" >&2
      kill -KILL "$daemon_pid" 2>/dev/null
    fi
    wait "$daemon_pid" 2>/dev/null
  fi
  rm -f "$sock"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_socket() {
  for _ in $(seq 300); do
    [ -S "$sock" ] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { echo "--- ringlmd log:"; cat "$work/ringlmd.log"; die "ringlmd exited at start"; }
    sleep 0.1
  done
  cat "$work/ringlmd.log"; die "ringlmd did not listen on $sock within 30 s"
}

# GET /metrics without curl: bash's /dev/tcp.
scrape() {
  local port=$1
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  sed '1,/^\r$/d' <&3
  exec 3<&-
}

help=$("$RINGLMD" --help 2>&1)
has() { grep -q -- "$1" <<<"$help"; }

# ---------------------------------------------------------------------------------------
if ! has --model; then
  say "ringlmd does not serve models yet: the transport echo demo"
  "$RINGLMD" --echo --socket "$sock" >"$work/ringlmd.log" 2>&1 &
  daemon_pid=$!
  wait_socket
  trace=$work/echo-trace.jsonl
  for i in $(seq 0 59); do
    t=$([ $((i % 2)) = 0 ] && echo alice || echo bob)
    printf '{"req":%d,"arrival_us":%d,"tenant":"%s","class":"default","prompt_tokens":%d,"output_tokens":%d}\n' \
      "$i" $((i * 5000)) "$t" $((10 + i)) 32 >>"$trace"
  done
  "$RINGLM" --socket "$sock" replay "$trace" --clients 2
  say "logs in $work"
  exit 0
fi

# ---------------------------------------------------------------------------------------
model=$SHARED/models/stories260K.bin
tok=$SHARED/models/tok512.bin
if [ -r "$model" ] && [ -r "$tok" ]; then
  text_mode=1
  say "model: $model (tokenizer $tok)"
else
  text_mode=0
  model=synthetic:stories260K:1
  tok=
  say "model: $model — stories260K not found under $SHARED, so this is a synthetic model"
  echo "   with random weights: its output is noise, shown as token ids."
fi

policy=$work/demo.policy
sed "s/@UID@/$(id -u)/" scripts/demo.policy >"$policy"
port=0 # ephemeral: ringlmd says which port it bound ("metrics on port N")
args=(--model "$model" --socket "$sock")
has --policy && args+=(--policy "$policy")
has --decision-log && args+=(--decision-log "$work/decisions.jsonl")
has --request-log && args+=(--request-log "$work/requests.jsonl")
has --metrics && args+=(--metrics "127.0.0.1:$port")
has --kv-blocks && args+=(--kv-blocks 512)
has --threads && args+=(--threads 1)
[ -n "$tok" ] && has --tokenizer && args+=(--tokenizer "$tok")
if has --check-config && has --policy; then
  "$RINGLMD" "${args[@]}" --check-config >"$work/policy.canonical" 2>&1 ||
    { cat "$work/policy.canonical"; die "the demo policy does not validate"; }
fi
say "starting: ringlmd ${args[*]}"
"$RINGLMD" "${args[@]}" >"$work/ringlmd.log" 2>&1 &
daemon_pid=$!
wait_socket
sed 's/^/   ringlmd: /' "$work/ringlmd.log" | head -8
if has --metrics; then
  port=$(sed -n 's/.*metrics on port \([0-9][0-9]*\).*/\1/p' "$work/ringlmd.log" | head -1)
  [ -n "$port" ] || echo "   (ringlmd did not say its metrics port: no metrics in this demo)"
fi
hasm() { has --metrics && [ -n "$port" ] && [ "$port" != 0 ]; }

# Two tenants' short chats (replayed open-loop: 40 requests, alternating alice/bob, a
# chat every 60 ms), one long prompt (bob, class batch), and alice's chat streamed here.
trace=$work/chats.jsonl
for i in $(seq 0 39); do
  t=$([ $((i % 2)) = 0 ] && echo alice || echo bob)
  printf '{"req":%d,"arrival_us":%d,"tenant":"%s","class":"chat","prompt_tokens":%d,"output_tokens":%d}\n' \
    "$i" $((i * 60000)) "$t" $((8 + (i * 7) % 40)) $((24 + (i * 5) % 40)) >>"$trace"
done
mx=()
hasm && mx=(--metrics "127.0.0.1:$port")
"$RINGLM" --socket "$sock" replay "$trace" --clients 2 --vocab 512 "${mx[@]}" >"$work/replay.txt" 2>&1 &
client_pids+=($!)

long_story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree."
long_prompt="$long_story"
for _ in 1 2 3 4 5 6; do long_prompt="$long_prompt $long_story"; done
if [ "$text_mode" = 1 ]; then
  "$RINGLM" --socket "$sock" generate --tenant bob --class batch --tokenizer "$tok" \
    --prompt "$long_prompt" --max-tokens 48 --stats >"$work/long.txt" 2>"$work/long.err" &
  client_pids+=($!)
  "$RINGLM" --socket "$sock" generate --tenant bob --class chat --tokenizer "$tok" \
    --prompt "The little dog" --max-tokens 100 --stats >"$work/bob.txt" 2>"$work/bob.err" &
  client_pids+=($!)
  say "alice's chat, streamed (greedy, stories260K):"
  "$RINGLM" --socket "$sock" generate --tenant alice --class chat --tokenizer "$tok" \
    --prompt "Once upon a time" --max-tokens 160 --stats
else
  ids=1; for i in $(seq 2 400); do ids="$ids,$((3 + (i * 37) % 500))"; done
  "$RINGLM" --socket "$sock" generate --tenant bob --class batch --prompt-ids "$ids" \
    --max-tokens 48 --stats >"$work/long.txt" 2>"$work/long.err" &
  client_pids+=($!)
  "$RINGLM" --socket "$sock" generate --tenant bob --class chat --prompt-ids 1,300,301,302 \
    --max-tokens 100 --stats >"$work/bob.txt" 2>"$work/bob.err" &
  client_pids+=($!)
  say "alice's chat, streamed (token ids of a synthetic model: noise):"
  "$RINGLM" --socket "$sock" generate --tenant alice --class chat --prompt-ids 1,400,401,402 \
    --max-tokens 40 --stats | tr '\n' ' '
  echo
fi
for p in "${client_pids[@]}"; do wait "$p"; done
client_pids=()

say "bob's chat (ran at the same time):"
if [ "$text_mode" = 1 ]; then cat "$work/bob.txt"; else tr '\n' ' ' <"$work/bob.txt"; echo; fi
cat "$work/bob.err"
say "bob's long prompt (~$(wc -w <<<"$long_prompt") words, class batch), its answer:"
if [ "$text_mode" = 1 ]; then tail -c 400 "$work/long.txt"; else tr '\n' ' ' <"$work/long.txt"; echo; fi
cat "$work/long.err"
say "per-tenant summary of the 40 replayed chats (ringlm replay):"
cat "$work/replay.txt"

if hasm; then
  say "metrics: http://127.0.0.1:$port/metrics (a few lines)"
  scrape "$port" >"$work/metrics.txt" 2>/dev/null || echo "   (scrape failed)"
  grep -E '^(vllm:|ringlm_info|ringlm_kv_blocks_(used|free)|ringlm_queue_depth|ringlm_generation_tokens_total|ringlm_rejects_total|ringlm_preemptions_total)' \
    "$work/metrics.txt" | head -16 | sed 's/^/   /'
fi
# One OpenAI-style streaming call through ringlm-gateway (HTTP in front of the same daemon,
# one more shared-memory client of it): curl prints the Server-Sent Events as they come.
GATEWAY=$BIN/ringlm-gateway
if [ "$text_mode" = 1 ] && [ -x "$GATEWAY" ] && command -v curl >/dev/null; then
  "$GATEWAY" --listen 127.0.0.1:0 --socket "$sock" --tokenizer "$tok" --served-model-name stories \
    --max-model-len 512 >"$work/gateway.log" 2>&1 &
  gateway_pid=$!
  gwport=
  for _ in $(seq 100); do
    gwport=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9][0-9]*\).*/\1/p' "$work/gateway.log" | head -1)
    [ -n "$gwport" ] && curl -sf "http://127.0.0.1:$gwport/health" >/dev/null && break
    kill -0 "$gateway_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$gwport" ] && curl -sf "http://127.0.0.1:$gwport/health" >/dev/null; then
    body='{"model":"stories","prompt":"Once upon a time","max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
    say "one streaming call through ringlm-gateway (greedy):"
    echo "   curl -N http://127.0.0.1:$gwport/v1/completions -H 'Content-Type: application/json' -d '$body'"
    curl -sN "http://127.0.0.1:$gwport/v1/completions" -H 'Content-Type: application/json' -d "$body" |
      grep -v '^$' | sed -E 's/"id":"[^"]*","object":"[^"]*","created":[0-9]*,"model":"[^"]*",/.../' |
      cut -c1-120 | sed 's/^/   /'
    echo "   (each event also carries id, object, created and model; shown as ...)"
  else
    echo "   (ringlm-gateway did not come up: $work/gateway.log)"
  fi
  kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" 2>/dev/null
  gateway_pid=
elif [ "$text_mode" = 1 ]; then
  echo "   (no ringlm-gateway streaming call: the gateway is not built or curl is missing)"
fi

say "where things are"
echo "   daemon log:    $work/ringlmd.log"
[ -e "$work/decisions.jsonl" ] && echo "   decision log:  $work/decisions.jsonl ($(wc -l <"$work/decisions.jsonl") lines so far), e.g.:" &&
  head -3 "$work/decisions.jsonl" | sed 's/^/      /'
[ -e "$work/requests.jsonl" ] && echo "   request log:   $work/requests.jsonl (replay it: ringlm-sim --trace $work/requests.jsonl)"
[ -e "$work/metrics.txt" ] && echo "   metrics:       $work/metrics.txt (scraped), live at 127.0.0.1:$port while the daemon ran"
echo "   policy:        $policy"
say "stopping ringlmd (SIGTERM drains)"
