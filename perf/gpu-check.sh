#!/usr/bin/env bash
# perf/gpu-check.sh — the CUDA backend's check on an H200 (../shared/GPU.md), in one run of a
# few minutes, from the repository root:
#
#   perf/gpu-check.sh                  every step, within BUDGET_S seconds (default 270)
#   perf/gpu-check.sh --only S1,S2     the build, then only these steps (a rerun of what the
#                                      budget skipped): parity gguf_run daemon_gguf perf suites
#                                      daemon_e2e calibrate
#   perf/gpu-check.sh --harness-on-cpu the steps that have a CPU stand-in (parity, gguf_run,
#                                      daemon_gguf, daemon_e2e) with --backend cpu as the device
#                                      under test: no GPU needed; how this script is checked
#   QUICK=1 ...                        fewer timed repetitions in gpu_bench
#   MEMCHECK=1 ...                     also compute-sanitizer memcheck over the parity checks
#   BUDGET_S=N ...                     the whole run's time limit in seconds
#
# Time: the steps run in the order above, most telling first, each under a timeout cut to what
# is left of BUDGET_S (10 s are kept for the table); a step that cannot get its minimum is
# listed "skip ... out of budget" with the --only to rerun it. With one device session of 15
# minutes (machine start included) run it with the tool's timeout_s of 300: the default
# budget of 270 s ends with the table before that, and leaves time for one rerun of what was
# skipped. Estimates for the H200 machine (none of this has run there yet): build 60-120 s
# (cuda_backend.cu alone took 60 s to compile on a loaded 2-vCPU VM), parity 20-40 s,
# gguf_run ~15 s, daemon_gguf ~60 s (5 files x 3 ringlmd starts, each CUDA start 1-3 s), so
# the first four steps fit in the default budget; perf and the suites take the rest of it or
# a rerun. --harness-on-cpu here (2-vCPU VM at load 13-15, build done): 103 s, daemon_gguf 89.
#
# Prepared beforehand on a machine with the Debian package registry (the check machine has
# none), from the repository root; both folders are git-ignored and must be carried along:
#
#   mkdir -p .debs && (cd .debs && apt-get download liburing2 liburing-dev libnuma1 \
#       libnuma-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 \
#       libquadmath0 libmicrohttpd12 libmicrohttpd-dev libinih1 libinih-dev libinireader0 \
#       libjansson4 libjansson-dev systemtap-sdt-dev libcriterion3 libcriterion-dev libnanomsg5 \
#       libgit2-1.5 libhttp-parser2.9 libmbedcrypto7 libmbedtls14 libmbedx509-1 libssh2-1 libffi8)
#   mkdir -p gpu-data && cp ../shared/models/{stories260K.bin,tok512.bin,reference-greedy.json} gpu-data/
#
# The .debs are unpacked into $DEPS_PREFIX (default /opt/deps), never into /. Data: $GPU_DATA,
# else gpu-data/, else $RINGLM_SHARED/models (../shared/models). Logs go to $OUT/gpu-check
# (when $OUT is set) else /tmp/ringlm-gpu-check; a short table is printed last.
# Exit status: 0 when every step that ran passed (skipped steps are listed, not failed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
HARNESS=0
ONLY=
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit "$1"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --harness-on-cpu) HARNESS=1; shift ;;
    --only) [ $# -ge 2 ] || usage 2; ONLY=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
DUT=cuda                       # the backend under test; the CPU backend is the reference
[ "$HARNESS" = 1 ] && DUT=cpu
LOG=${OUT:+$OUT/gpu-check}
LOG=${LOG:-/tmp/ringlm-gpu-check}
mkdir -p "$LOG"
DEPS=${DEPS_PREFIX:-/opt/deps}
B=${B:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
QUICK=${QUICK:-0}
BUDGET_S=${BUDGET_S:-270}
DATA=${GPU_DATA:-$ROOT/gpu-data}
[ -d "$DATA" ] || DATA=${RINGLM_SHARED:-$ROOT/../shared}/models
t_start=$(date +%s)
dpid=
ggwork=
# whatever way this ends, no daemon of ours keeps running and no file is left in /tmp
trap '[ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null; [ -n "$ggwork" ] && rm -rf "$ggwork"' EXIT

rows=()   # "status|step|detail" for the table printed last
note() { rows+=("$1|$2|$3"); printf '%-5s %-22s %s\n' "$1" "$2" "$3"; }
say() { printf '\n== %s (at %d s)\n' "$*" $(($(date +%s) - t_start)); }
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
# budget STEP MAX MIN: whether STEP runs now; if so T is its timeout, MAX seconds or what is
# left of BUDGET_S (less 10 s for the table) when that is shorter. A step left out by --only
# returns 1 quietly; one with less than MIN seconds left is listed as skipped.
budget() {
  want "$1" || return 1
  local l=$((BUDGET_S - ($(date +%s) - t_start) - 10))
  if [ "$l" -lt "$3" ]; then
    note skip "$1" "out of budget: ${l} s of BUDGET_S=$BUDGET_S left, needs $3 s (rerun: --only $1)"
    return 1
  fi
  T=$((l < $2 ? l : $2))
}

# ---- daemons and clients (daemon_gguf, daemon_e2e) ------------------------------------------
# start_daemon NAME BACKEND MODEL [ringlmd options...]: ringlmd on $work/NAME.sock, its log
# in $LOG/ringlmd-NAME.log; sets dpid and sock; 0 once it listens (within 60 s), else 1 with
# the daemon stopped. Waiting here polls for the socket file: the daemon has no readiness
# signal a shell can block on.
start_daemon() {
  local name=$1 be=$2 model=$3
  shift 3
  sock=$work/$name.sock
  local nice=()
  [ "$HARNESS" = 1 ] && nice=(--nice 0)   # a shared machine: no priority over its other users
  "$B/bin/ringlmd" --backend "$be" --model "$model" --socket "$sock" "${nice[@]}" "$@" \
    >"$LOG/ringlmd-$name.log" 2>&1 &
  dpid=$!
  for _ in $(seq 600); do
    [ -S "$sock" ] && return 0
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.1
  done
  tail -5 "$LOG/ringlmd-$name.log"
  stop_daemon
  return 1
}
# stop_daemon: SIGTERM (the daemon drains), SIGKILL after 15 s; 0 when it exited by itself
stop_daemon() {
  kill -TERM "$dpid" 2>/dev/null
  for _ in $(seq 150); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$dpid" 2>/dev/null
  wait "$dpid" 2>/dev/null
  dpid=
}

# gguf_set_eos FILE ID: FILE's tokenizer.ggml.eos_token_id (a uint32, as ringlm-mkmodel writes
# it) becomes ID, in place: the file's stop token is then one the model really samples.
gguf_set_eos() {
  local key=tokenizer.ggml.eos_token_id off type
  off=$(grep -obUaF "$key" "$1" | head -1 | cut -d: -f1)
  [ -n "$off" ] || { echo "$1: no $key" >&2; return 1; }
  type=$(od -An -tu4 -j $((off + ${#key})) -N4 "$1" | tr -d ' ')
  [ "$type" = 4 ] || { echo "$1: $key is of GGUF type $type, not uint32 (4)" >&2; return 1; }
  printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($2 & 255)) $(($2 >> 8 & 255)) \
    $(($2 >> 16 & 255)) $(($2 >> 24 & 255)))" |
    dd of="$1" bs=1 seek=$((off + ${#key} + 4)) conv=notrunc status=none
}

# decode_rate ITERATION_LOG N: the daemon's decode tok/s at N sequences — N / the median
# period of its iterations that decoded exactly N sequences and prefilled nothing — and how
# many such iterations there were. When none decoded N at once (a client late to start), the
# figure is for the most sequences any did decode together, written RATE@M.
decode_rate() {
  awk -v want="$2" '
    function num(k) { return match($0, "\"" k "\":[0-9]+") ? substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0 : -1 }
    num("prefill_tokens") == 0 && num("period_us") > 0 && num("decode_seqs") > 0 {
      b = num("decode_seqs"); p[b, c[b]++] = num("period_us"); if (b > most) most = b
    }
    END {
      b = c[want] ? want : most
      n = c[b]
      if (!n) { print "n/a 0"; exit }
      for (i = 0; i < n; i++) q[i] = p[b, i]
      for (i = 1; i < n; i++) for (j = i; j > 0 && q[j - 1] > q[j]; j--) { t = q[j]; q[j] = q[j - 1]; q[j - 1] = t }
      med = n % 2 ? q[(n - 1) / 2] : (q[n / 2 - 1] + q[n / 2]) / 2
      printf "%.0f%s %d\n", b * 1e6 / med, b == want ? "" : "@" b, n
    }' "$1"
}

# gated_clients N OUTPREFIX CLIENT-ARGS...: N `ringlm generate` processes let go at once (each
# reads a line from a FIFO before it execs the client, and the N lines are written once all
# are started, so process start is not staggered into the measurement); stdout to
# OUTPREFIX.i, stderr to OUTPREFIX.i.err; how many exited 0 in $clients_ok.
gated_clients() {
  local n=$1 out=$2 gate=$work/gate i p pids=()
  shift 2
  rm -f "$gate" && mkfifo "$gate"
  exec 9<>"$gate"  # read-write: no open of the FIFO blocks, and the lines wait for readers
  for i in $(seq "$n"); do
    (read -r _ <"$gate"; exec timeout "$T" "$B/bin/ringlm" --socket "$sock" generate "$@" >"$out.$i" 2>"$out.$i.err") &
    pids+=($!)
  done
  printf '%*s' "$n" '' | tr ' ' '\n' >&9   # one line each: a shell's read takes one line of a pipe
  clients_ok=0
  for p in "${pids[@]}"; do wait "$p" && clients_ok=$((clients_ok + 1)); done
  exec 9>&-
  rm -f "$gate"
}

# ---- 1. dependencies, toolchain, build ------------------------------------------------------
say "dependencies"
if ls .debs/*.deb >/dev/null 2>&1; then
  mkdir -p "$DEPS"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEPS" || echo "cannot unpack $f"; done
  ML=x86_64-linux-gnu
  export CPATH="$DEPS/usr/include:$DEPS/usr/include/$ML:$DEPS/usr/include/$ML/openblas-pthread${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$DEPS/usr/lib/$ML:$DEPS/usr/lib/$ML/openblas-pthread:$DEPS/lib/$ML${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$DEPS/usr/lib/$ML:$DEPS/usr/lib/$ML/openblas-pthread:$DEPS/lib/$ML${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note ok deps "$(ls .debs/*.deb | wc -l) packages unpacked into $DEPS"
else
  note warn deps "no .debs/ folder: relying on system libraries"
fi
export PATH="$PATH:/usr/local/cuda/bin"
for f in stories260K.bin tok512.bin reference-greedy.json; do
  [ -f "$DATA/$f" ] || note warn data "$DATA/$f missing: copy it from ../shared/models (see the top of this script)"
done

if [ "$HARNESS" = 1 ]; then
  note ok mode "--harness-on-cpu: the device under test is the CPU backend (no GPU used)"
  # niced: on a shared development machine the build must not slow the others' work
  if nice -n 10 make -j"$JOBS" B="$B" all >"$LOG/build-all.log" 2>&1; then note ok build "make all"
  else tail -20 "$LOG/build-all.log"; note FAIL build "make all failed: see $LOG/build-all.log"; fi
else
  say "toolchain"
  { nvcc --version; echo; nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } 2>&1 | tee "$LOG/toolchain.log"
  gpu=$(nvidia-smi -L 2>/dev/null | head -1)
  note "$([ -n "$gpu" ] && echo ok || echo FAIL)" device "${gpu:-nvidia-smi -L shows no GPU}"
  note ok nvcc "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"

  say "build (make CUDA=1 B=$B)"
  if make -j"$JOBS" CUDA=1 B="$B" "$B/lib/libringlm_cuda.so" "$B/perf/gpu_bench" >"$LOG/build.log" 2>&1; then
    note ok build "plugin + gpu_bench ($B/lib/libringlm_cuda.so)"
  else
    tail -40 "$LOG/build.log"
    note FAIL build "see $LOG/build.log"
  fi
  # The rest of the tree (daemon, clients, calibrate) — failures here do not stop the GPU checks.
  make -j"$JOBS" CUDA=1 B="$B" all >"$LOG/build-all.log" 2>&1 && note ok build-all "make all" \
    || note warn build-all "make all failed: see $LOG/build-all.log"
  export RINGLM_CUDA_LIB="$ROOT/$B/lib/libringlm_cuda.so"
fi

# ---- 2. parity (perf/gpu_bench --only parity: llama2.c and GGUF files, CPU vs device) -------
gpu_bench_step() {  # STEP gpu_bench-args...
  local step=$1 rc nfail npass
  shift
  timeout "$T" "$B/perf/gpu_bench" --data "$DATA" "$@" 2>&1 | tee "$LOG/gpu_bench-$step.log"
  rc=${PIPESTATUS[0]}
  # the summary's lines (each check is also printed as it runs)
  nfail=$(sed -n '/^== summary ==/,$p' "$LOG/gpu_bench-$step.log" | grep -c '^FAIL')
  npass=$(sed -n '/^== summary ==/,$p' "$LOG/gpu_bench-$step.log" | grep -c '^PASS')
  case $rc in
    0) note ok "$step" "gpu_bench: $npass checks passed" ;;
    2) note FAIL "$step" "gpu_bench: no usable device or plugin (see $LOG/gpu_bench-$step.log)" ;;
    124) note FAIL "$step" "gpu_bench timed out after $T s ($npass passed, $nfail failed by then)" ;;
    *) note FAIL "$step" "gpu_bench rc=$rc: $nfail of $((npass + nfail)) checks failed" ;;
  esac
}
qflag=(); [ "$QUICK" = 1 ] && qflag=(--quick)
if budget parity 240 30; then
  say "gpu_bench --only parity"
  if [ ! -x "$B/perf/gpu_bench" ]; then note FAIL parity "gpu_bench not built"
  elif [ "$HARNESS" = 1 ]; then gpu_bench_step parity --harness-on-cpu --quick --json "$LOG/gpu_bench-parity.json"
  else gpu_bench_step parity --only parity "${qflag[@]}" --json "$LOG/gpu_bench-parity.json"; fi
  if [ "$HARNESS" = 0 ] && [ "${MEMCHECK:-0}" = 1 ] && command -v compute-sanitizer >/dev/null \
     && budget parity 600 120; then
    say "compute-sanitizer memcheck (parity only, graphs off)"
    timeout "$T" compute-sanitizer --tool memcheck --error-exitcode 99 \
      "$B/perf/gpu_bench" --data "$DATA" --only parity --quick --no-cuda-graphs \
      >"$LOG/memcheck.log" 2>&1
    rc=$?
    tail -5 "$LOG/memcheck.log"
    note "$([ $rc -eq 0 ] || [ $rc -eq 1 ] && echo ok || echo FAIL)" memcheck \
      "rc=$rc ($(grep -c 'Invalid\|out of bounds' "$LOG/memcheck.log") errors reported)"
  fi
fi

# ---- 3. GGUF files end to end ---------------------------------------------------------------
# The files: stories260K converted by ringlm-mkmodel in each type (its tok512 vocabulary in the
# file), and a synthetic GQA qwen2 shape (gqa-test: 8 query heads on 2 KV heads, Q/K/V biases,
# NEOX RoPE) in Q8_0 with the same vocabulary, so text clients can use it too.
GGUF_TYPES="F16 BF16 Q8_0 Q4_K_M"
make_gguf_files() {  # into $ggwork: s260k-TYPE.gguf and gqa-qwen2-Q8_0.gguf; 1 when impossible
  [ -n "$ggwork" ] && return 0
  if ! [ -x "$B/bin/ringlm-mkmodel" ] || ! [ -f "$DATA/stories260K.bin" ] || ! [ -f "$DATA/tok512.bin" ]; then
    return 1
  fi
  ggwork=$(mktemp -d /tmp/ringlm-gpu-gguf.XXXXXX)
  local t
  for t in $GGUF_TYPES; do
    "$B/bin/ringlm-mkmodel" --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" \
      --format gguf --type "$t" --out "$ggwork/s260k-$t.gguf" >"$LOG/mkmodel-$t.log" 2>&1 ||
      rm -f "$ggwork/s260k-$t.gguf"
  done
  "$B/bin/ringlm-mkmodel" --model synthetic:gqa-test:1 --arch qwen2 --tokenizer "$DATA/tok512.bin" \
    --format gguf --type Q8_0 --out "$ggwork/gqa-qwen2-Q8_0.gguf" >"$LOG/mkmodel-gqa-qwen2.log" 2>&1 ||
    rm -f "$ggwork/gqa-qwen2-Q8_0.gguf"
  return 0
}

# ringlm-run decodes each stories260K file on both backends from the same prompt (greedy, 200
# positions, the file's own tokenizer): the text must be the same; the device run's tok/s
# (stderr) is recorded (stories260K is tiny: a launch-bound figure; the stories110M-shape
# tok/s are gpu_bench's gguf.s110m-* lines).
if budget gguf_run 120 20; then
  say "GGUF: ringlm-mkmodel + ringlm-run, CPU vs $DUT"
  if [ -x "$B/bin/ringlm-run" ] && make_gguf_files; then
    for type in $GGUF_TYPES; do
      budget gguf_run 60 10 || break   # each file's two runs: at most what is left
      f=$ggwork/s260k-$type.gguf
      if ! [ -f "$f" ]; then
        note FAIL "gguf_run:$type" "ringlm-mkmodel failed: $(tail -1 "$LOG/mkmodel-$type.log")"
        continue
      fi
      for side in ref dut; do   # the reference: the CPU backend; the device under test: $DUT
        be=cpu; [ "$side" = dut ] && be=$DUT
        timeout "$T" "$B/bin/ringlm-run" --model "$f" --prompt "Once upon a time" --steps 200 \
          --temperature 0 --backend "$be" >"$ggwork/out-$type-$side" 2>"$LOG/run-gguf-$type-$side.log"
        echo "rc=$?" >>"$LOG/run-gguf-$type-$side.log"
      done
      speed=$(grep -o 'achieved tok/s: [0-9.]*' "$LOG/run-gguf-$type-dut.log" | awk '{printf "%.0f tok/s decode", $3}')
      if grep -q 'rc=0' "$LOG/run-gguf-$type-ref.log" && grep -q 'rc=0' "$LOG/run-gguf-$type-dut.log" \
         && [ -s "$ggwork/out-$type-dut" ] && cmp -s "$ggwork/out-$type-ref" "$ggwork/out-$type-dut"; then
        note ok "gguf_run:$type" "$DUT text equals the CPU's (200 positions); $DUT ${speed:-? tok/s}"
      else
        cp "$ggwork/out-$type-ref" "$ggwork/out-$type-dut" "$LOG/" 2>/dev/null
        note FAIL "gguf_run:$type" "$DUT output differs from the CPU's or a run failed (see $LOG/run-gguf-$type-*.log, out-$type-*)"
      fi
    done
  else
    note skip gguf_run "ringlm-mkmodel/ringlm-run not built or stories260K.bin/tok512.bin missing"
  fi
fi

# ringlmd --backend $DUT on each GGUF file against ringlmd --backend cpu on the same file, the
# same real `ringlm generate` clients on each, all at once:
#   - 6 text clients (3 prompts, 2 each, the file's own tokenizer, greedy, 200 positions,
#     --ignore-stop): each text equals the CPU daemon's for the same client;
#   - 2 stop clients (token ids, no --ignore-stop): the file's EOS is first set to the 17th
#     token the CPU daemon generates for that prompt (a copy of the file, patched), so the
#     daemon must report that stop token at start and end both requests with finish "stop"
#     right before its first occurrence — the ids equal the CPU reference's up to there;
#   - then decode tok/s through the daemon at 1 and 32 clients (480 tokens each, started at
#     once): N / the median period of the iterations that decoded exactly N sequences
#     (--iteration-log), on the CPU daemon and the device's, side by side.
PROMPTS=("Once upon a time" "The little dog" "Lily wanted to")
PIDS=1,403,407,261,378          # BOS "Once upon a time" in tok512 (the stop clients' prompt)
daemon_gguf_file() {  # NAME FILE
  local name=$1 f=$2 side be s k i j ok=1 why=() rate1 rate32 n1 n32 perf=()
  work=$ggwork/d-$name
  mkdir -p "$work"
  # the reference ids: the CPU daemon on the file as written
  if ! start_daemon "$name-ref" cpu "$f" --kv-blocks 64; then
    note FAIL "daemon_gguf:$name" "the CPU ringlmd did not listen (see $LOG/ringlmd-$name-ref.log)"
    return
  fi
  timeout "$T" "$B/bin/ringlm" --socket "$sock" generate --prompt-ids "$PIDS" --max-tokens 48 --ignore-stop \
    >"$work/ref.ids" 2>"$work/ref.err"
  stop_daemon
  s=$(sed -n 17p "$work/ref.ids")
  if [ -z "$s" ]; then
    note FAIL "daemon_gguf:$name" "no reference ids from the CPU daemon: $(tail -1 "$work/ref.err")"
    return
  fi
  k=$(grep -n -x -m1 "$s" "$work/ref.ids" | cut -d: -f1)
  k=$((k - 1))      # tokens before the stop token: what a stop client must receive
  cp "$f" "$work/stop.gguf"
  if ! gguf_set_eos "$work/stop.gguf" "$s" 2>"$work/patch.err"; then
    note FAIL "daemon_gguf:$name" "cannot set the file's EOS: $(cat "$work/patch.err")"
    return
  fi
  head -n "$k" "$work/ref.ids" >"$work/want-stop.ids"
  for side in ref dut; do   # the reference: the CPU backend; the device under test: $DUT
    be=cpu; [ "$side" = dut ] && be=$DUT
    if ! start_daemon "$name-$side" "$be" "$work/stop.gguf" --kv-blocks 1280 \
         --iteration-log "$work/it-$side.jsonl"; then
      ok=0; why+=("ringlmd $side (--backend $be) did not listen (see $LOG/ringlmd-$name-$side.log)")
      continue
    fi
    grep -qE "stop tokens ([0-9]+ )*$s( |\$)" "$LOG/ringlmd-$name-$side.log" ||
      { ok=0; why+=("ringlmd $side (--backend $be) does not report stop token $s"); }
    local pids=()
    for i in 0 1 2 3 4 5; do
      timeout "$T" "$B/bin/ringlm" --socket "$sock" generate --tokenizer "$work/stop.gguf" \
        --prompt "${PROMPTS[i % 3]}" --steps 200 --ignore-stop >"$work/$side.text.$i" 2>"$work/$side.text.$i.err" &
      pids+=($!)
    done
    for j in 0 1; do
      timeout "$T" "$B/bin/ringlm" --socket "$sock" generate --prompt-ids "$PIDS" --max-tokens 64 --stats \
        >"$work/$side.stop.$j" 2>"$work/$side.stop.$j.err" &
      pids+=($!)
    done
    local nok=0
    for i in "${pids[@]}"; do wait "$i" && nok=$((nok + 1)); done
    [ "$nok" = 8 ] || { ok=0; why+=("$((8 - nok)) of 8 clients of the $side ($be) daemon failed"); }
    for j in 0 1; do
      if ! grep -q 'finish stop' "$work/$side.stop.$j.err"; then
        ok=0; why+=("$side ($be) stop client $j: not finished by the stop token ($(grep -o 'finish [a-z_]*' "$work/$side.stop.$j.err"))")
      elif ! cmp -s "$work/$side.stop.$j" "$work/want-stop.ids"; then
        ok=0; why+=("$side ($be) stop client $j: $(wc -l <"$work/$side.stop.$j") ids, want the reference's $k before token $s")
      fi
    done
    for i in 0 1 2 3 4 5; do
      [ -s "$work/$side.text.$i" ] || { ok=0; why+=("$side ($be) text client $i: no text"); }
    done
    # decode rates: 1 client, then 32 at once (the few 1-sequence iterations at the end of
    # the 32 and among the 8 above do not move the 1-client median)
    gated_clients 1 "$work/$side.tp1" --prompt-ids "$PIDS" --max-tokens 480 --ignore-stop
    [ "$clients_ok" = 1 ] || { ok=0; why+=("the 1-client throughput run of the $side ($be) daemon failed"); }
    gated_clients 32 "$work/$side.tp32" --prompt-ids "$PIDS" --max-tokens 480 --ignore-stop
    [ "$clients_ok" = 32 ] || { ok=0; why+=("$((32 - clients_ok)) of 32 throughput clients of the $side ($be) daemon failed"); }
    stop_daemon
    read -r rate1 n1 < <(decode_rate "$work/it-$side.jsonl" 1)
    read -r rate32 n32 < <(decode_rate "$work/it-$side.jsonl" 32)
    perf+=("$side $be $rate1 / $rate32")
    printf '%s %s decode tok/s through ringlmd: 1 client %s (%s iterations), 32 clients %s (%s iterations)\n' \
      "$name" "$side ($be)" "$rate1" "$n1" "$rate32" "$n32" | tee -a "$LOG/daemon_gguf-rates.log"
  done
  for i in 0 1 2 3 4 5; do
    cmp -s "$work/ref.text.$i" "$work/dut.text.$i" ||
      { ok=0; why+=("text client $i (\"${PROMPTS[i % 3]}\"): $DUT text differs from the CPU's"); }
  done
  if [ "$ok" = 1 ]; then
    note ok "daemon_gguf:$name" "8 clients: 6 texts equal the CPU daemon's, 2 stopped at stop token $s after $k tokens; decode tok/s at 1 / 32 clients: $(IFS=','; echo "${perf[*]}")"
  else
    mkdir -p "$LOG/daemon_gguf-$name" && cp "$work"/*.ids "$work"/*.text.* "$work"/*.stop.* "$LOG/daemon_gguf-$name/" 2>/dev/null
    note FAIL "daemon_gguf:$name" "$(IFS=';'; echo "${why[*]}") (outputs in $LOG/daemon_gguf-$name)"
  fi
}
if budget daemon_gguf 240 30; then
  say "GGUF: ringlmd --backend $DUT vs ringlmd --backend cpu, real clients"
  if [ -x "$B/bin/ringlmd" ] && [ -x "$B/bin/ringlm" ] && make_gguf_files; then
    for file in "$ggwork"/s260k-*.gguf "$ggwork"/gqa-qwen2-Q8_0.gguf; do
      name=$(basename "$file" .gguf)
      [ -f "$file" ] || { note FAIL "daemon_gguf:$name" "ringlm-mkmodel did not write it (see $LOG/mkmodel-*.log)"; continue; }
      budget daemon_gguf 240 20 || break   # T: every client's limit in this file's checks
      daemon_gguf_file "$name" "$file"
    done
  else
    note skip daemon_gguf "ringlmd/ringlm/ringlm-mkmodel not built or stories260K.bin/tok512.bin missing"
  fi
fi
[ -n "$ggwork" ] && rm -rf "$ggwork" && ggwork=

# ---- 4. throughput (perf/gpu_bench --only perf) ---------------------------------------------
if [ "$HARNESS" = 0 ] && budget perf 300 60; then
  say "gpu_bench --only perf (llama3-8b shape, stories110M-shape GGUF files)"
  if [ -x "$B/perf/gpu_bench" ]; then gpu_bench_step perf --only perf "${qflag[@]}" --json "$LOG/gpu_bench-perf.json"
  else note FAIL perf "gpu_bench not built"; fi
fi

# ---- 5. the Criterion suites of the backend (the same checks, as tests) ---------------------
# test_cuda_backend: llama2.c models and synthetic shapes; test_cuda_gguf: GGUF files written
# by the exporter (stories260K F16/BF16/Q8_0/Q4_K_M, qwen2 Q4_K_M with Qwen2's epsilon, base
# and half-head RoPE patched in, Llama 3.1 RoPE factors added, GQA F16) against the CPU backend,
# and the host-side upload.
for suite in test_cuda_backend test_cuda_gguf; do
  [ "$HARNESS" = 0 ] && budget suites 300 60 || continue
  if make -j"$JOBS" CUDA=1 B="$B" "$B/tests/$suite" >"$LOG/build-$suite.log" 2>&1; then
    shared=$(mktemp -d /tmp/ringlm-shared.XXXXXX)
    mkdir -p "$shared/models" && cp "$DATA"/* "$shared/models/" 2>/dev/null
    say "tests/$suite"
    RINGLM_SHARED="$shared" timeout "$T" "$B/tests/$suite" --jobs 1 >"$LOG/$suite.log" 2>&1
    rc=$?
    grep -E 'FAIL|SKIP|Synthesis' "$LOG/$suite.log" | head -20
    note "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$suite" "$(grep -a 'Synthesis' "$LOG/$suite.log" | tail -1 | sed 's/.*Synthesis: //')"
    rm -rf "$shared"
  else
    note warn "$suite" "not built (criterion missing?): see $LOG/build-$suite.log"
  fi
done

# ---- 6. the daemon on a llama2.c file (its run.c reference), and the calibration file -------
if budget daemon_e2e 90 20; then
  say "ringlmd --backend $DUT (llama2.c stories260K, 9 clients)"
  if [ -x "$B/bin/ringlmd" ] && [ -f "$DATA/stories260K.bin" ] && [ -f "$DATA/tok512.bin" ]; then
    work=$(mktemp -d /tmp/ringlm-gpu-e2e.XXXXXX)
    if start_daemon e2e "$DUT" "$DATA/stories260K.bin" --kv-blocks 512 --host-kv-blocks 512 \
         --request-log "$work/requests.jsonl" --decision-log "$work/decisions.jsonl" \
         --stats-file "$work/stats.json"; then
      ok=0; n=8; pids=()
      for i in $(seq $n); do
        timeout "$T" "$B/bin/ringlm" --socket "$sock" generate --prompt "Once upon a time" \
          --tokenizer "$DATA/tok512.bin" --steps 200 >"$work/out.$i" 2>"$work/err.$i" &
        pids+=($!)
      done
      # one long-prompt client and a sampled one beside the chats
      timeout "$T" "$B/bin/ringlm" --socket "$sock" generate --prompt "$(printf 'The little dog ran. %.0s' $(seq 40))" \
        --tokenizer "$DATA/tok512.bin" --max-tokens 64 --temperature 0.8 --top-p 0.9 --seed 3 \
        >"$work/out.long" 2>&1 &
      pids+=($!)
      for p in "${pids[@]}"; do wait "$p" && ok=$((ok + 1)); done
      want=""
      if command -v python3 >/dev/null; then
        want=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for c in d["cases"]:
    if c["prompt"]=="Once upon a time" and c["n_arg"]==200: sys.stdout.write(c["stdout"])' \
          "$DATA/reference-greedy.json")
      fi
      same=0
      if [ -n "$want" ]; then
        for i in $(seq $n); do [ "$(cat "$work/out.$i")" = "$want" ] && same=$((same + 1)); done
        detail="$ok/$((n + 1)) clients ok; greedy text equals run.c for $same/$n"
      else
        detail="$ok/$((n + 1)) clients ok (no python3: text not compared)"
      fi
      cp "$work"/*.jsonl "$work/stats.json" "$LOG/" 2>/dev/null
      stop_daemon
      distinct=$(for i in $(seq $n); do md5sum <"$work/out.$i"; done | sort -u | wc -l)
      detail="$detail; $distinct distinct greedy output(s) across the $n clients"
      # bf16 may part from run.c at a near-tie (the fp32 check in gpu_bench tells): warn only
      st=FAIL
      if [ $ok -eq $((n + 1)) ]; then
        st=ok
        { [ -n "$want" ] && [ $same -ne $n ]; } && st=warn
      fi
      note $st daemon_e2e "$detail"
    else
      note FAIL daemon_e2e "ringlmd did not listen (see $LOG/ringlmd-e2e.log)"
    fi
    rm -rf "$work"
  else
    note skip daemon_e2e "ringlmd missing or stories260K.bin/tok512.bin missing"
  fi
fi

if [ "$HARNESS" = 0 ] && budget calibrate 300 60; then
  say "perf/calibrate --backend cuda"
  if [ -x "$B/perf/calibrate" ] && "$B/perf/calibrate" --help 2>&1 | grep -q -- '--backend'; then
    for spec in "$DATA/stories260K.bin" synthetic:lazy:llama3-8b:1; do
      name=$(basename "$spec" .bin | tr ':' '_')
      budget calibrate 300 30 || break
      timeout "$T" "$B/perf/calibrate" --model "$spec" --backend cuda --quick --no-disk \
        --kv-blocks 2048 --host-kv-blocks 256 -o "$LOG/calibration-cuda-$name.json" \
        >"$LOG/calibrate-$name.log" 2>&1
      rc=$?
      tail -5 "$LOG/calibrate-$name.log"
      note "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "calibrate:$name" \
        "rc=$rc -> $LOG/calibration-cuda-$name.json"
    done
  else
    note skip calibrate "perf/calibrate missing or without --backend"
  fi
fi

# ---- 7. the table ----------------------------------------------------------------------------
say "summary ($(($(date +%s) - t_start)) s of BUDGET_S=$BUDGET_S; logs in $LOG)"
for f in "$LOG"/gpu_bench-parity.log "$LOG"/gpu_bench-perf.log; do
  [ -f "$f" ] && sed -n '/^== summary ==/,/skipped$/p' "$f" | sed 1d
done
echo
fail=0
for r in "${rows[@]}"; do
  IFS='|' read -r st step detail <<<"$r"
  printf '%-5s %-22s %s\n' "$st" "$step" "$detail"
  [ "$st" = FAIL ] && fail=1
done
exit $fail
