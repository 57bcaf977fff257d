#!/usr/bin/env bash
# Installs the pinned npm packages of the test oracles (tests/node/package-lock.json) when
# node and npm are present; `make deps` calls this after install-deps.sh. Tests never
# download: without these, the oracle tests skip with a message.
set -euo pipefail
cd "$(dirname "$0")/../tests/node"
if ! command -v npm >/dev/null 2>&1; then
  echo "node-deps: npm not found; the llama.cpp oracle tests will skip"; exit 0
fi
if [ node_modules/.package-lock.json -nt package-lock.json ]; then
  echo "node-deps: all present"; exit 0
fi
# --ignore-scripts: node-llama-cpp's postinstall would look for a binary to download or
# build; the prebuilt one comes as the @node-llama-cpp/linux-x64 dependency instead.
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --ignore-scripts --no-audit --no-fund
