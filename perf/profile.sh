#!/usr/bin/env bash
# Profiles ringlmd under a workload: starts the daemon (stories260K when present, else a
# synthetic model; the echo service with --echo or when the daemon cannot serve models),
# attaches `perf record -g` (frame pointers: the build keeps them) to it, replays a short
# slice of the Azure conversation trace with `ringlm replay`, and prints the top of the
# profile. Exit 77 (skip) when perf is missing or not allowed.
#
#   B=build perf/profile.sh [--echo] [--limit N] [--rate X] [--clients N] [--out DIR] [--no-usdt]
#
# It also counts the daemon's USDT probes (sdt_ringlmd:iteration_start, :decision) with
# `perf stat` during the replay — uprobes it adds for the run and deletes afterwards.
#
# Needs linux-perf (Debian: apt-get install linux-perf) and perf_event_paranoid <= 1 or root.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
BIN=$B/bin
SHARED=${RINGLM_SHARED:-../shared}
limit=200 rate=4 clients=4 echo_mode=0 out= usdt=1
while [ $# -gt 0 ]; do
  case $1 in
    --echo) echo_mode=1 ;;
    --limit) limit=$2; shift ;;
    --rate) rate=$2; shift ;;
    --clients) clients=$2; shift ;;
    --out) out=$2; shift ;;
    --no-usdt) usdt=0 ;;
     -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
daemon_pid= perf_pid= stat_pid=
added_probes=()
cleanup() {
  [ -n "$perf_pid" ] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid" 2>/dev/null
  [ -n "$stat_pid" ] && kill -INT "$stat_pid" 2>/dev/null && wait "$stat_pid" 2>/dev/null
  for p in "${added_probes[@]}"; do perf probe -q -d "$p" >/dev/null 2>&1; done
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
usdt_ev=()
if [ $usdt = 1 ] && readelf -n "$BIN/ringlmd" 2>/dev/null | grep -q 'Provider: ringlmd'; then
  perf buildid-cache --add "$BIN/ringlmd" >/dev/null 2>&1
  for ev in iteration_start decision; do
    if perf probe -l 2>/dev/null | grep -q "sdt_ringlmd:$ev "; then
      usdt_ev+=(-e "sdt_ringlmd:$ev")          # someone else's probe: use it, leave it
      continue
    fi
    # A probe inlined at several places reports "File exists" for the second location
    # although the event was created: judge by the listing, not by the exit status.
    perf probe -q -x "$BIN/ringlmd" -a "sdt_ringlmd:$ev" >/dev/null 2>&1
    if perf probe -l 2>/dev/null | grep -q "sdt_ringlmd:$ev "; then
      usdt_ev+=(-e "sdt_ringlmd:$ev")
      added_probes+=("sdt_ringlmd:$ev")
    fi
  done
  if [ ${#usdt_ev[@]} -gt 0 ]; then
    perf stat "${usdt_ev[@]}" -p "$daemon_pid" -o "$work/usdt.txt" >/dev/null 2>&1 &
    stat_pid=$!
  else
    echo "profile: USDT probes present but perf could not attach uprobes to them (skipped)"
  fi
fi
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
if [ -n "$stat_pid" ]; then
  kill -INT "$stat_pid" 2>/dev/null
  wait "$stat_pid" 2>/dev/null
  stat_pid=
  echo
  echo "profile: USDT probe hits during the replay (perf stat):"
  grep -E 'sdt_ringlmd|elapsed' "$work/usdt.txt" | sed 's/^ */   /'
fi
echo
echo "profile: top of the profile (self time, symbols >= 0.5%); full data: perf report -i $work/perf.data"
perf report -i "$work/perf.data" --stdio --no-children --sort dso,symbol --percent-limit 0.5 \
  -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | sed 's/[[:space:]]*-[[:space:]]*-[[:space:]]*$//' | head -40
perf report -i "$work/perf.data" --stdio --no-children --sort symbol -g caller,0.5,callee --percent-limit 5 \
  2>/dev/null | grep -v '^#' | grep -v '^$' >"$work/callgraph.txt"
echo
echo "profile: call graphs of the hottest symbols: $work/callgraph.txt"
