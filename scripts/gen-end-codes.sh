#!/usr/bin/env bash
# Writes the block of end-code values in libclient/ringlm.h from the one table,
# common/end_codes.h (see the comment there for why ringlm.h carries a generated copy).
#   scripts/gen-end-codes.sh          rewrite the block (make gen-end-codes)
#   scripts/gen-end-codes.sh --check  exit 1 when the block differs from the table (make test)
# The table is expanded by the C preprocessor, so this script never parses C itself; the
# block is then put through clang-format (when present) so the file stays formatted.
set -eu
cd "$(dirname "$0")/.."
hdr=libclient/ringlm.h
begin='/* ---- end codes: generated from common/end_codes.h by scripts/gen-end-codes.sh ---- */'
end='/* ---- end of the generated end codes ---- */'
cc=${CC:-cc}
cf=${CLANG_FORMAT:-clang-format}

rows=$(printf '#include "common/end_codes.h"\n#define ROW(s, v, n, d) @ROW s v n d\nEND_CODES(ROW)\n' |
  "$cc" -E -P -I. -x c - | tr '@' '\n' | sed -n 's/^ROW //p')
[ -n "$rows" ] || { echo "gen-end-codes: the table expanded to nothing" >&2; exit 1; }

block=$(echo "$rows" | awk '
  {
    suffix = $1; value = $2 + 0; name = $3
    doc = $0; sub(/^[^ ]+ [^ ]+ "[^"]*" +"/, "", doc); sub(/" *$/, "", doc)
    gsub(/" +"/, "", doc) # adjacent string literals, as C joins them
    if (suffix == "NONE") next
    prefix = value < 16 ? "RINGLM_FINISH_" : "RINGLM_R_"
    if (value < 16 && !said_finish++) print "/* Finish reasons (ringlm_event.finish_reason). */"
    if (value >= 16 && !said_cause++) {
      print "/* Causes (ringlm_event.reject_reason): why a request was rejected, or the daemon-side"
      print " * cause of a cancel/timeout/error when there is one; 0 otherwise. */"
    }
    printf "/* %s: %s */\n#define %s%s %d\n", name, doc, prefix, suffix, value
  }')

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.fmt"' EXIT
awk -v b="$begin" -v e="$end" -v blk="$block" '
  $0 == b { print; print blk; skip = 1; found++; next }
  $0 == e { skip = 0 }
  !skip { print }
  END { if (found != 1) exit 3 }' "$hdr" >"$tmp" || {
  echo "gen-end-codes: $hdr needs exactly one line: $begin" >&2; exit 1; }
if command -v "$cf" >/dev/null 2>&1; then
  "$cf" --assume-filename="$hdr" <"$tmp" >"$tmp.fmt" && mv "$tmp.fmt" "$tmp"
fi

if [ "${1:-}" = "--check" ]; then
  if ! cmp -s "$tmp" "$hdr"; then
    echo "check-end-codes: $hdr's end codes differ from common/end_codes.h (make gen-end-codes):" >&2
    diff -u "$hdr" "$tmp" >&2 || true
    exit 1
  fi
  exit 0
fi
cmp -s "$tmp" "$hdr" || cat "$tmp" >"$hdr"
