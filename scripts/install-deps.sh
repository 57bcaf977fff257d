#!/usr/bin/env bash
# Installs the Debian packages ringlm's build, tests and tools need, when missing.
# Run as root (CI and the dev machines are root); `make deps` calls this.
set -euo pipefail
pkgs=(
  build-essential pkg-config
  liburing-dev            # daemon event loop, KV transfers
  libnuma-dev             # NUMA topology, pinning, node-local memory
  libcriterion-dev        # tests
  libopenblas-dev         # CPU SGEMM
  libmicrohttpd-dev       # /metrics
  libinih-dev             # policy files
  libjansson-dev          # JSON: reference oracles, traces, calibration
  libxxhash-dev           # XXH3-128 prefix-cache block keys
  libpcre2-dev            # byte-level BPE pre-tokenizers (Unicode-property regexes)
  libutf8proc-dev         # NFC normalization of Qwen's vocabularies (Unicode tables)
  libzmq3-dev             # KV-cache events: vLLM's ZMQ PUB and replay ROUTER sockets
  libmsgpack-dev          # KV-cache events: msgpack-c, vLLM's event encoding
  python3-zmq python3-msgpack  # tests: a KV-event subscriber decoding as vLLM's does
  python3-yaml            # make check-deploy: deploy/'s Kubernetes manifests
  python3-jsonschema      # tests: structured output answers validated against their schema
  systemtap-sdt-dev       # USDT probes (sys/sdt.h)
  clang libclang-rt-14-dev  # libFuzzer target (make fuzz)
  clang-format            # the one C style (.clang-format), checked by make test
  gnuplot-nox             # simulator plots
  curl                    # gateway tests and `make demo`: the real HTTP client
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross  # make check-portable: the CPU backend for arm64
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "deps: all present"; exit 0; fi
echo "deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
