#!/usr/bin/env bash
# scripts/tsan-check.sh — every place ringlm runs threads, under ThreadSanitizer (`make tsan`).
#
# Criterion cannot start under TSAN (Snaipe/Criterion#274), so the Criterion suites are not
# the TSAN check: these plain programs are, built with TSAN=1 into $B (default build-tsan):
#   ring     perf/ipc_bench --ring-threads: the shm event ring + futex doorbell, two threads
#   engine   perf/tsan_engine: the CPU engine's worker pool (N workers vs 1, mixed batches)
#   obs      perf/tsan_obs: daemon/metrics (snapshot publish vs HTTP + direct scrapes) and
#            daemon/declog (loop thread → writer thread rings)
#   client   perf/tsan_client: libringlm's submit thread + reader thread on one client,
#            against a TSAN ringlmd --echo
#   daemon   the whole ringlmd (model, 2 engine workers, metrics thread, log writer) serving
#            concurrent `ringlm generate` clients and a `ringlm replay`, a /metrics scrape,
#            then SIGTERM
#   gateway  ringlm-gateway (HTTP threads, tokenize workers, session readers, the metrics
#            relay) in front of a ringlmd: concurrent completions and chat, streamed and not,
#            a client that leaves mid-stream, /v1/models, /health and /metrics, then SIGTERM
#            to both
# A check fails when its program exits non-zero or any "WARNING: ThreadSanitizer" appears
# in what it (or a daemon or client it started) printed. Prints "N passed, N failed" last.
#
# Env: B (build dir), RINGLM_SHARED (default ../shared: models/stories260K.bin, tok512.bin;
# a synthetic model is used without them), TSAN_OPTIONS (appended to), KEEP=1 keeps the
# logs of passing checks too.
set -u
cd "$(dirname "$0")/.."
B=${B:-build-tsan}
SHARED=${RINGLM_SHARED:-../shared}
pass=0
fail=0
failed=()

# Suppressions only for third-party libraries (see the file); never for ringlm's own code.
supp=
[ -s scripts/tsan.supp ] && supp="suppressions=$PWD/scripts/tsan.supp"
export TSAN_OPTIONS="second_deadlock_stack=1${supp:+ $supp}${TSAN_OPTIONS:+ $TSAN_OPTIONS}"

for p in perf/ipc_bench perf/tsan_engine perf/tsan_obs perf/tsan_client bin/ringlmd bin/ringlm \
  bin/ringlm-gateway; do
  if [ ! -x "$B/$p" ]; then
    echo "tsan-check: $B/$p is missing: build it with make tsan (or make TSAN=1 B=$B ...)" >&2
    exit 2
  fi
done
if ! nm "$B/perf/tsan_obs" 2>/dev/null | grep -q __tsan_init; then
  echo "tsan-check: $B was not built with -fsanitize=thread (make TSAN=1 B=$B)" >&2
  exit 2
fi

work=$(mktemp -d /tmp/ringlm-tsan.XXXXXX)
daemon_pid=
gateway_pid=
cleanup() {
  local p
  for p in "$gateway_pid" "$daemon_pid"; do
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null
      wait "$p" 2>/dev/null
    fi
  done
  [ "${KEEP:-0}" = 1 ] || [ $fail -gt 0 ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Some kernels place mappings where this TSAN runtime does not expect them (high ASLR
# entropy): then run without address randomisation.
run=()
if "$B/perf/tsan_obs" --help 2>&1 | grep -q "unexpected memory mapping"; then
  echo "tsan-check: TSAN cannot map its shadow with ASLR here; running under setarch -R"
  run=(setarch "$(uname -m)" -R)
fi

# result NAME SECONDS RC LOG...: pass when RC is 0 and no log holds a TSAN report.
result() {
  local name=$1 secs=$2 rc=$3
  shift 3
  local reports
  reports=$(cat "$@" 2>/dev/null | grep -c "WARNING: ThreadSanitizer")
  if [ "$rc" = 0 ] && [ "$reports" = 0 ]; then
    pass=$((pass + 1))
    echo "[PASS] $name ($secs s)"
  else
    fail=$((fail + 1))
    failed+=("$name")
    echo "[FAIL] $name ($secs s, exit $rc, $reports ThreadSanitizer report(s)); logs:"
    for f in "$@"; do
      [ -s "$f" ] || continue
      echo "--- $f"
      head -c 60000 "$f"
    done
  fi
}

# check NAME CMD...: runs CMD (2 minutes at most), its output into one log.
check() {
  local name=$1
  shift
  local log=$work/$name.log
  local t0=$SECONDS
  timeout -k 5 120 "${run[@]}" "$@" >"$log" 2>&1
  local rc=$?
  grep -a -E "^(tsan_|bare ring)" "$log" | sed 's/^/       /'
  result "$name" $((SECONDS - t0)) $rc "$log"
}

# ---- 1-4: the plain programs -------------------------------------------------------------
check ring "$B/perf/ipc_bench" --ring-threads 1000000
check engine-gqa "$B/perf/tsan_engine" --model synthetic:gqa-test:3 --threads 2 --steps 24
model=$SHARED/models/stories260K.bin
tok=$SHARED/models/tok512.bin
[ -r "$model" ] || model=synthetic:stories260K:1
[ -r "$model" ] && [ -r "$tok" ] || tok=
check engine-260K "$B/perf/tsan_engine" --model "$model" --threads 3 --steps 24
check obs "$B/perf/tsan_obs" --iters 100000 --lines 100000
check client "$B/perf/tsan_client" --daemon "$B/bin/ringlmd" --requests 100000

# ---- 5: the whole daemon -----------------------------------------------------------------
daemon_check() {
  local sock=$work/ringlmd.sock dlog=$work/ringlmd.log
  local gen=() ids=0
  if [ -n "$tok" ]; then
    gen=(--prompt "Once upon a time" --tokenizer "$tok")
  else
    gen=(--prompt-ids 1,400,401,402,403,404,405,406)
    ids=1
  fi
  # A small device pool and a host tier: four long-ish requests at once do not fit, so the
  # scheduler preempts (swap over io_uring or recompute) while the workers run.
  "${run[@]}" "$B/bin/ringlmd" --model "$model" ${tok:+--tokenizer "$tok"} --socket "$sock" \
    --threads 2 --kv-blocks 24 --host-kv-blocks 64 --metrics 127.0.0.1:0 \
    --decision-log "$work/decisions.jsonl" --request-log "$work/requests.jsonl" \
    --drain-grace-ms 20000 >"$dlog" 2>&1 &
  daemon_pid=$!
  local port= i
  for i in $(seq 600); do # 60 s: the socket and the metrics port
    port=$(sed -n 's/.*metrics on port \([0-9][0-9]*\).*/\1/p' "$dlog" | head -1)
    [ -S "$sock" ] && [ -n "$port" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! [ -S "$sock" ] || [ -z "$port" ]; then
    echo "tsan-check: ringlmd did not listen (socket and metrics port) within 60 s" >>"$dlog"
    kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid"
    daemon_pid=
    return 1
  fi
  # Concurrent clients: two identical greedy requests, a sampled one, a long one, and a
  # replay of 40 requests from 2 forked client processes.
  local pids=() k
  for k in 0 1; do
    timeout -k 5 90 "${run[@]}" "$B/bin/ringlm" --socket "$sock" generate "${gen[@]}" \
      --max-tokens 120 >"$work/gen$k.out" 2>"$work/gen$k.err" &
    pids+=($!)
  done
  timeout -k 5 90 "${run[@]}" "$B/bin/ringlm" --socket "$sock" generate "${gen[@]}" \
    --max-tokens 100 --temperature 0.8 --top-k 40 --seed 7 >"$work/gen2.out" 2>"$work/gen2.err" &
  pids+=($!)
  timeout -k 5 90 "${run[@]}" "$B/bin/ringlm" --socket "$sock" generate --prompt-ids \
    "$(seq -s, 3 80)" --max-tokens 150 >"$work/gen3.out" 2>"$work/gen3.err" &
  pids+=($!)
  local trace=$work/trace.jsonl
  : >"$trace"
  for i in $(seq 0 39); do
    printf '{"req":%d,"arrival_us":%d,"tenant":"","class":"default","prompt_tokens":%d,"output_tokens":%d}\n' \
      "$i" $((i * 10000)) $((5 + i % 12 * 3)) $((10 + i % 12 * 2)) >>"$trace"
  done
  timeout -k 5 90 "${run[@]}" "$B/bin/ringlm" --socket "$sock" replay "$trace" --clients 2 \
    --vocab 512 >"$work/replay.out" 2>"$work/replay.err" &
  pids+=($!)
  # One scrape while the clients run.
  local scraped=0
  if command -v curl >/dev/null; then
    curl -s -m 20 "http://127.0.0.1:$port/metrics" >"$work/metrics.txt" && scraped=1
  else
    { exec 3<>"/dev/tcp/127.0.0.1/$port" &&
      printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3 >"$work/metrics.txt" && exec 3<&-; } &&
      scraped=1
  fi
  local bad=0 p
  for p in "${pids[@]}"; do
    wait "$p" || bad=1
  done
  [ $bad = 0 ] || echo "tsan-check: a client failed (gen*.err, replay.err)" >>"$dlog"
  if [ $scraped = 0 ] || ! grep -q '^ringlm_info{' "$work/metrics.txt"; then
    echo "tsan-check: /metrics scrape on port $port failed or has no ringlm_info" >>"$dlog"
    bad=1
  fi
  if [ $ids = 0 ] && ! cmp -s "$work/gen0.out" "$work/gen1.out"; then
    echo "tsan-check: two identical greedy requests got different text" >>"$dlog"
    bad=1
  fi
  # SIGTERM: drain and exit 0.
  kill -TERM "$daemon_pid"
  local rc=0
  wait "$daemon_pid" || rc=$?
  daemon_pid=
  if [ $rc != 0 ]; then
    echo "tsan-check: ringlmd exited $rc after SIGTERM$([ $rc = 66 ] && echo " (ThreadSanitizer's exit code)")" >>"$dlog"
    bad=1
  fi
  local nreq
  nreq=$(wc -l <"$work/requests.jsonl" 2>/dev/null || echo 0)
  if [ "$nreq" != 44 ] || ! [ -s "$work/decisions.jsonl" ]; then
    echo "tsan-check: request log has $nreq lines (expected 44), decision log $(wc -l <"$work/decisions.jsonl" 2>/dev/null || echo 0)" >>"$dlog"
    bad=1
  fi
  echo "       ringlmd: 44 requests from 6 client processes, $(grep -c '"preempt' "$work/decisions.jsonl" 2>/dev/null) preemption decisions, $(wc -l <"$work/metrics.txt") /metrics lines, exit $rc"
  return $bad
}
t0=$SECONDS
daemon_check
rc=$?
result daemon $((SECONDS - t0)) $rc "$work"/ringlmd.log "$work"/gen*.err "$work"/replay.err "$work"/replay.out

# ---- 6: the gateway in front of a daemon -------------------------------------------------
# wait_log FILE PID REGEX: the first capture of REGEX's sed group in FILE, waiting up to 60 s
# while PID lives; empty when it never came.
wait_log() {
  local f=$1 pid=$2 re=$3 v= i
  for i in $(seq 600); do
    v=$(sed -n "s/$re/\1/p" "$f" | head -1)
    [ -n "$v" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$v"
}
gateway_check() {
  local sock=$work/gw-ringlmd.sock dlog=$work/gw-ringlmd.log glog=$work/gateway.log
  if [ -z "$tok" ]; then
    echo "       gateway: skipped (no tokenizer in $SHARED/models)"
    return 0
  fi
  "${run[@]}" "$B/bin/ringlmd" --model "$model" --tokenizer "$tok" --socket "$sock" \
    --threads 2 --metrics 127.0.0.1:0 --drain-grace-ms 20000 >"$dlog" 2>&1 &
  daemon_pid=$!
  local mport
  mport=$(wait_log "$dlog" "$daemon_pid" '.*metrics on port \([0-9][0-9]*\).*')
  local i
  for i in $(seq 600); do
    [ -S "$sock" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! [ -S "$sock" ] || [ -z "$mport" ]; then
    echo "tsan-check: ringlmd did not listen within 60 s" >>"$dlog"
    return 1
  fi
  "${run[@]}" "$B/bin/ringlm-gateway" --listen 127.0.0.1:0 --socket "$sock" --tokenizer "$tok" \
    --sessions 2 --tokenize-threads 2 --daemon-metrics "127.0.0.1:$mport" \
    --drain-grace-ms 20000 >"$glog" 2>&1 &
  gateway_pid=$!
  local port
  port=$(wait_log "$glog" "$gateway_pid" '.*listening on http:\/\/127\.0\.0\.1:\([0-9][0-9]*\).*')
  if [ -z "$port" ]; then
    echo "tsan-check: ringlm-gateway did not listen within 60 s" >>"$glog"
    return 1
  fi
  local url=http://127.0.0.1:$port pids=() k bad=0
  for k in 0 1 2 3; do
    curl -s -m 90 "$url/v1/completions" -H 'content-type: application/json' \
      -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"stream\":$([ $((k % 2)) = 0 ] && echo true || echo false)}" \
      >"$work/gw$k.out" 2>"$work/gw$k.err" &
    pids+=($!)
  done
  for k in 4 5; do
    curl -s -m 90 "$url/v1/chat/completions" -H 'content-type: application/json' \
      -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell a story $k\"}],\"max_tokens\":40,\"stream\":$([ $k = 4 ] && echo true || echo false)}" \
      >"$work/gw$k.out" 2>"$work/gw$k.err" &
    pids+=($!)
  done
  # A client that leaves mid-stream: curl stops after 0.3 s of a long stream.
  curl -s -m 0.3 "$url/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt":"Once","max_tokens":400,"stream":true,"ignore_eos":true}' >/dev/null 2>&1 &
  local leaver=$!
  curl -s -m 20 "$url/v1/models" >"$work/gw-models.out" || bad=1
  curl -s -m 20 "$url/health" >/dev/null || bad=1
  curl -s -m 20 "$url/metrics" >"$work/gw-metrics.txt" || bad=1
  for k in "${pids[@]}"; do
    wait "$k" || bad=1
  done
  wait "$leaver"
  for k in 0 1 2 3 4 5; do
    if ! grep -q '"finish_reason"' "$work/gw$k.out"; then
      echo "tsan-check: gateway request $k has no finish_reason (gw$k.out)" >>"$glog"
      bad=1
    fi
  done
  grep -q '"data"' "$work/gw-models.out" || { echo "tsan-check: /v1/models answered no list" >>"$glog"; bad=1; }
  local rc=0
  kill -TERM "$gateway_pid"
  wait "$gateway_pid" || rc=$?
  gateway_pid=
  [ $rc = 0 ] || { echo "tsan-check: ringlm-gateway exited $rc after SIGTERM" >>"$glog"; bad=1; }
  rc=0
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || rc=$?
  daemon_pid=
  [ $rc = 0 ] || { echo "tsan-check: ringlmd exited $rc after SIGTERM" >>"$dlog"; bad=1; }
  echo "       gateway: 7 HTTP requests (1 left mid-stream), /v1/models, /health, /metrics ($(wc -l <"$work/gw-metrics.txt") lines), exits after SIGTERM"
  return $bad
}
t0=$SECONDS
gateway_check
rc=$?
result gateway $((SECONDS - t0)) $rc "$work"/gateway.log "$work"/gw-ringlmd.log "$work"/gw*.err

echo
[ $fail -gt 0 ] && echo "failed: ${failed[*]} (logs in $work)"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
