#!/usr/bin/env bash
# Builds and runs every libFuzzer target for a bounded time (make fuzz).
#   B            build dir (targets go to $B/fuzz/)
#   FUZZ_SRCS    targets, fuzz/fuzz_<name>.c; a line "fuzz-sources: a.c b.c" in a target
#                names the project sources it needs (default: shm/*.c), and a line
#                "fuzz-libs: -lx" the system libraries
#   FUZZ_SECONDS time per target (default 30)
# Seeds: fuzz/corpus/<name>/ (read only here); new inputs go to a temporary corpus, and
# crashes to $B/fuzz/<name>-crashes/.  Exit status 1 when any target found a crash.
set -u
cd "$(dirname "$0")/.."
B="${B:-build}"
SECS="${FUZZ_SECONDS:-30}"
CLANG="${CLANG:-clang}"
if ! command -v "$CLANG" >/dev/null; then
  echo "fuzz: $CLANG not found (scripts/install-deps.sh installs clang)"; exit 1
fi
mkdir -p "$B/fuzz"
rc=0
for src in ${FUZZ_SRCS:-fuzz/fuzz_*.c}; do
  [ -f "$src" ] || continue
  name=$(basename "$src" .c); name=${name#fuzz_}
  deps=$(sed -n 's/.*fuzz-sources:[[:space:]]*//p' "$src" | head -1)
  [ -n "$deps" ] || deps=$(ls shm/*.c)
  libs=$(sed -n 's/.*fuzz-libs:[[:space:]]*//p' "$src" | head -1)
  bin="$B/fuzz/$name"
  echo "fuzz: building $name ($deps)"
  if ! "$CLANG" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Ilibclient \
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
       -o "$bin" "$src" $deps $libs -lm; then
    echo "fuzz: $name does not build"; rc=1; continue
  fi
  work=$(mktemp -d)
  crashes="$B/fuzz/$name-crashes"; mkdir -p "$crashes"
  seeds="fuzz/corpus/$name"; [ -d "$seeds" ] || seeds=""
  echo "fuzz: running $name for ${SECS}s (seeds: ${seeds:-none})"
  if ! "$bin" -max_total_time="$SECS" -print_final_stats=1 -artifact_prefix="$crashes/" \
       "$work" $seeds 2>"$B/fuzz/$name.log"; then
    echo "fuzz: $name FAILED — see $B/fuzz/$name.log and $crashes/"; tail -30 "$B/fuzz/$name.log"; rc=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$B/fuzz/$name.log" | sed "s/^/fuzz: $name: /"
  fi
  rm -rf "$work"
done
exit $rc
