#!/usr/bin/env bash
# DESIGN.md §1: arrows point one way. Every folder of ours lists what it may include; an
# include of ours outside that list fails the build (`make check-layering`, part of
# `make test`). Includes are "folder/file.h" paths from the repository root; a bare
# "file.h" must name a file of the including folder itself (the compiler's -Ilibclient
# would otherwise let any folder reach libclient/ unseen), except "ringlm.h", the public
# header, which counts as libclient/. An angle-bracket include is checked the same way when it
# names a file of ours (<daemon/x.h>, <ringlm.h>), and sched/ may not include the headers of
# threads, clocks, files or signals (<pthread.h>, <time.h>, <unistd.h>, <sys/...>, ...).
set -u
cd "$(dirname "$0")/.."
ours="common shm sched numa formats model constrain libclient kernels sim daemon gateway tools perf tests fuzz"
bad=0

# folder | the folders its files may include besides its own (a file path allows that one file)
# common/ (header-only, libc-only helpers: the error detail) is below everything: every folder
# may include it, and it includes nothing of ours.
rules() {
cat <<'EOF'
common    |
shm       |
sched     |
numa      |
formats   |
model     |
constrain | model
libclient | shm model
kernels   | numa model
sim       | sched formats
gateway   | libclient formats
tools     | libclient shm formats
daemon    | shm sched numa kernels formats libclient model constrain
fuzz      | shm libclient formats sched model constrain
EOF
}
# model/ (model files and text: GGUF read and write, tokenizers, chat templates) depends on
# common/ only; the engine and the client library read and write model files through it.
# perf/ and tests/ may include everything: they exercise every module, the daemon's
# internals included (tests/ and perf/ are the daemon's tests); nothing else includes daemon/.

# One pass: every quoted include of every rule's folder, checked in awk.
files=$(rules | while IFS='|' read -r folder _; do
          folder=$(echo "$folder" | tr -d ' ')
          [ -d "$folder" ] && find "$folder" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
        done | sort)
if [ -n "$files" ]; then
  # shellcheck disable=SC2086
  grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' $files /dev/null |
  awk -v ours="$ours" -v rules="$(rules)" '
    BEGIN {
      n = split(ours, o, " "); for (i = 1; i <= n; i++) isours[o[i]] = 1
      nr = split(rules, rl, "\n")
      for (i = 1; i <= nr; i++) {
        split(rl[i], kv, "|"); f = kv[1]; gsub(/ /, "", f); allow[f] = " " kv[2] " "
      }
    }
    function ok(folder, inc,   top) {
      top = inc; sub(/\/.*/, "", top)
      if (top == folder || top == "common") return 1
      return index(allow[folder], " " top " ") || index(allow[folder], " " inc " ")
    }
    {
      file = $0; sub(/:.*/, "", file)
      rest = substr($0, length(file) + 2); line = rest; sub(/:.*/, "", line)
      angle = rest ~ /include[[:space:]]*</
      inc = rest
      if (angle) { sub(/^[^<]*</, "", inc); sub(/>.*/, "", inc) }
      else { sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc) }
      folder = file; sub(/\/.*/, "", folder)
      dir = file; sub(/\/[^\/]*$/, "", dir)
      top = inc; sub(/\/.*/, "", top)
      # <...> names a system header unless it is one of ours in disguise: "folder/x.h" of
      # ours, or the public header that -Ilibclient makes reachable as <ringlm.h>.
      if (angle && !(inc ~ /\// && (top in isours)) && inc != "ringlm.h") {
        # sched/: no I/O, no clock reads, no threads (DESIGN §1) — not even their headers.
        if (folder == "sched" && inc ~ /^(pthread|threads|time|unistd|fcntl|stdatomic|dirent|poll|signal)\.h$|^sys\//)
        { printf "layering: %s:%s includes <%s>: sched/ does no I/O, reads no clock, starts no threads\n", file, line, inc; bad = 1 }
        next
      }
      why = ""
      if (inc ~ /(^|\/)\.\.\//) why = "a relative path"
      else if (inc ~ /\//) {
        top = inc; sub(/\/.*/, "", top)
        if ((top in isours) && !ok(folder, inc))
        { a = allow[folder]; gsub(/^ +| +$/, "", a)
          why = folder "/ may include only its own files" (a != "" ? " and " a : "") }
      } else if (inc == "ringlm.h") {
        if (!ok(folder, "libclient/ringlm.h")) why = folder "/ may not reach libclient/"
      } else if (system("test -e \"" dir "/" inc "\"") != 0)
        why = "a bare include that is not a file of " dir "/ (write the folder: \"folder/" inc "\")"
      if (why != "") { printf "layering: %s:%s includes \"%s\": %s\n", file, line, inc, why; bad = 1 }
    }
    END { exit bad }' || bad=1
fi

# Every source folder has a rule: a new folder is placed in the layering before it builds.
for d in */; do
  d=${d%/}
  case " $ours " in *" $d "*) continue ;; esac
  if find "$d" -maxdepth 2 -name '*.c' | grep -q .; then
    echo "layering: $d/ has C sources but no rule in scripts/check-layering.sh"
    bad=1
  fi
done
exit $bad
