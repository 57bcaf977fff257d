#!/usr/bin/env bash
# The tree's one C style is .clang-format (CONTRIBUTING.md). `make test` runs this: every
# tracked .c/.h must already be formatted (`make format` applies it). Exits 1 naming each
# file that is not, 0 when all are; skips (exit 0, with a line saying so) without clang-format.
set -u
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "check-format: $cf not found, formatting not checked (scripts/install-deps.sh installs it)"
  exit 0
fi
files=$(git ls-files '*.c' '*.h' 2>/dev/null) || files=$(find . -name '*.[ch]' -not -path './build*')
# One clang-format over every file; its complaints name file:line:col.
# shellcheck disable=SC2086
out=$("$cf" --dry-run -Werror $files 2>&1 >/dev/null)
if [ -n "$out" ]; then
  echo "$out" | grep -oE '^[^:]+\.[ch]:[0-9]+' | awk -F: '!seen[$1]++ {print "check-format: " $1 ":" $2 " is not formatted (make format)"}'
  exit 1
fi
exit 0
