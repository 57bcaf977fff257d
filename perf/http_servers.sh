# perf/http_servers.sh — sourced by the HTTP benchmarks (llama_compare.sh, http_burst_ab.sh):
# ringlmd + ringlm-gateway, or llama-server, started on one GGUF file and stopped the same way
# for every benchmark. Uses B (the build), THREADS, LLAMA_SERVER (llama-server's path) and
# LLAMA_SERVER_ARGS (more llama-server options, split at spaces: "--poll 0" lets its threads
# sleep instead of spinning, which a loaded machine needs — spinning, each of its barriers
# waited for a descheduled thread and a 110M model took 2 s a token at load 10).
#
#   http_start_ringlm FILE DIR KV_BLOCKS [ringlmd options...]
#   http_start_llama FILE DIR SLOTS CONTEXT
# start the server (logs in DIR), wait until its /health answers, and set HTTP_PORT and
# HTTP_PIDS; they return 1 (the logs' tails on stderr, the processes stopped) when it did not
# come up. stop_pids $HTTP_PIDS stops it.
#
# llama.cpp's weight repacking, LLAMA_REPACK: "on" runs llama.cpp as it runs by default (it
# repacks Q4_0, IQ4_NL, Q4_K and others into its interleaved layouts where the CPU has the
# kernels: its fastest decode here); "off" passes --no-repack for every quantized file; "auto"
# (the default) is "on", and where a run with repacking fails (llama.cpp's AMX repack dies
# with SIGILL on VMs that report AMX without enabling it) that run is done again with
# --no-repack. llama_quantized FILE: whether the file's type (its name's last part) is not a
# float type. LLAMA_REPACK_USED says what the last llama-server start ran with.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_health() { # port pid
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop_pids() { local p; for p in "$@"; do kill "$p" 2>/dev/null || true; done; for p in "$@"; do wait "$p" 2>/dev/null || true; done; }

http_start_ringlm() {
  local f=$1 dir=$2 kv=$3 sock=$2/d.sock dpid gpid
  shift 3
  HTTP_PORT= HTTP_PIDS=
  rm -f "$sock"
  "$B/bin/ringlmd" --socket "$sock" --numa-node off --model "$f" --threads "$THREADS" \
    --kv-blocks "$kv" --quiet "$@" >"$dir/ringlmd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 600); do [ -S "$sock" ] && break; sleep 0.1; done
  "$B/bin/ringlm-gateway" --listen 127.0.0.1:0 --socket "$sock" --tokenizer "$f" --quiet \
    >"$dir/gateway.log" 2>&1 &
  gpid=$!
  HTTP_PIDS="$gpid $dpid"
  for _ in $(seq 600); do
    HTTP_PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$dir/gateway.log" 2>/dev/null | head -1)
    [ -n "$HTTP_PORT" ] && break
    sleep 0.1
  done
  if [ -z "$HTTP_PORT" ] || ! wait_health "$HTTP_PORT" "$gpid"; then
    tail -5 "$dir/ringlmd.log" "$dir/gateway.log" >&2
    stop_pids $HTTP_PIDS
    return 1
  fi
}

llama_quantized() {
  case "$(basename "$1" .gguf)" in *-F32 | *-F16 | *-BF16) return 1 ;; *) return 0 ;; esac
}
case "${LLAMA_REPACK:=auto}" in
  auto | on | off) ;;
  *) echo "LLAMA_REPACK=$LLAMA_REPACK: auto, on or off" >&2; exit 2 ;;
esac

# at the nice ringlmd takes by default (-10 where permitted; GNU nice runs it as it is where
# not), so that on a busy machine neither server is favoured by its priority
http_start_llama() {
  local f=$1 dir=$2 np=$3 ctx=$4 extra=() try
  LLAMA_REPACK_USED=default
  if [ "$LLAMA_REPACK" = off ] && llama_quantized "$f"; then
    extra=(--no-repack) LLAMA_REPACK_USED=no-repack
  fi
  for try in 1 2; do
    HTTP_PORT=$(free_port)
    nice -n -10 "$LLAMA_SERVER" -m "$f" -t "$THREADS" -np "$np" -c "$ctx" \
      --host 127.0.0.1 --port "$HTTP_PORT" "${extra[@]}" ${LLAMA_SERVER_ARGS:-} \
      >"$dir/llama-server.log" 2>&1 &
    HTTP_PIDS=$!
    wait_health "$HTTP_PORT" "$HTTP_PIDS" && return 0
    tail -5 "$dir/llama-server.log" >&2
    stop_pids $HTTP_PIDS
    [ "$try" = 1 ] && [ "$LLAMA_REPACK" = auto ] && [ ${#extra[@]} = 0 ] && llama_quantized "$f" ||
      return 1
    echo "llama-server did not come up repacking $f: again with --no-repack" >&2
    extra=(--no-repack) LLAMA_REPACK_USED=no-repack
  done
  return 1
}
