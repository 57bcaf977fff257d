#!/usr/bin/env bash
# Profiles ringlmd under a workload: starts the daemon (stories260K when present, else a
# synthetic model; the echo service with --echo or when the daemon cannot serve models),
# attaches `perf record -g` (frame pointers: the build keeps them) to it, replays a short
# slice of the Azure conversation trace with `ringlm replay`, and prints the top of the
# profile. Exit 77 (skip) when perf is missing or not allowed.
#
#   B=build perf/profile.sh [--echo] [--limit N] [--rate X] [--clients N] [--out DIR]
#
# Needs linux-perf (Debian: apt-get install linux-perf) and perf_event_paranoid <= 1 or root.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
BIN=$B/bin
SHARED=${RINGLM_SHARED:-../shared}
limit=200 rate=4 clients=4 echo_mode=0 out=
while [ $# -gt 0 ]; do
  case $1 in
    --echo) echo_mode=1 ;;
    --limit) limit=$2; shift ;;
    --rate) rate=$2; shift ;;
    --clients) clients=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "profile: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v perf >/dev/null 2>&1; then
  echo "profile: perf is not installed (Debian: apt-get install linux-perf); skipping" >&2
  exit 77
fi
if ! perf record -q -o /dev/null -- true >/dev/null 2>&1; then
  echo "profile: perf record is not permitted here (kernel.perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null); run as root or lower it); skipping" >&2
  exit 77
fi
for p in ringlmd ringlm; do
  [ -x "$BIN/$p" ] || { echo "profile: $BIN/$p not built (make B=$B)" >&2; exit 1; }
done
trace=$SHARED/traces/AzureLLMInferenceTrace_conv.csv
synth=
if [ ! -r "$trace" ]; then
  # No trace: a synthetic native one (arrivals every 20 ms, chat-sized requests).
  synth=1
fi

work=${out:-$(mktemp -d /tmp/ringlm-profile.XXXXXX)}
mkdir -p "$work"
sock=$work/ringlmd.sock
daemon_pid= perf_pid=
cleanup() {
  [ -n "$perf_pid" ] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid" 2>/dev/null
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  rm -f "$sock"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

help=$("$BIN/ringlmd" --help 2>&1)
if [ $echo_mode = 0 ] && grep -q -- --model <<<"$help"; then
  model=$SHARED/models/stories260K.bin
  [ -r "$model" ] || model=synthetic:stories260K:1
  dargs=(--model "$model")
  vocab=512 what="model $model"
else
  dargs=(--echo)
  vocab=259 what="the echo service"
fi
"$BIN/ringlmd" "${dargs[@]}" --socket "$sock" >"$work/ringlmd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; kill -0 $daemon_pid 2>/dev/null || break; sleep 0.1; done
[ -S "$sock" ] || { cat "$work/ringlmd.log"; echo "profile: ringlmd did not start" >&2; exit 1; }

perf record -g --call-graph fp -F 999 -p "$daemon_pid" -o "$work/perf.data" >"$work/perf.log" 2>&1 &
perf_pid=$!
sleep 0.3 # perf attaches asynchronously; nothing to poll for but its own log

if [ -n "$synth" ]; then
  trace=$work/synthetic.jsonl
  for i in $(seq 0 $((limit - 1))); do
    printf '{"req":%d,"arrival_us":%d,"prompt_tokens":%d,"output_tokens":%d}\n' "$i" $((i * 20000)) \
      $((16 + (i * 13) % 96)) $((16 + (i * 7) % 48)) >>"$trace"
  done
fi
echo "profile: $what; replaying $limit requests of $(basename "$trace") at rate x$rate with $clients clients"
"$BIN/ringlm" --socket "$sock" replay "$trace" --limit "$limit" --rate "$rate" --clients "$clients" \
  --max-context 256 --length-scale 0.1 --vocab "$vocab" | tee "$work/replay.txt"

kill -INT "$perf_pid" 2>/dev/null
wait "$perf_pid" 2>/dev/null
perf_pid=
echo
echo "profile: top of the profile (self time, symbols >= 0.5%); full data: perf report -i $work/perf.data"
perf report -i "$work/perf.data" --stdio --no-children --sort dso,symbol --percent-limit 0.5 \
  -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | sed 's/[[:space:]]*-[[:space:]]*-[[:space:]]*$//' | head -40
perf report -i "$work/perf.data" --stdio --no-children --sort symbol -g caller,0.5,callee --percent-limit 5 \
  2>/dev/null | grep -v '^#' | grep -v '^$' >"$work/callgraph.txt"
echo
echo "profile: call graphs of the hottest symbols: $work/callgraph.txt"
