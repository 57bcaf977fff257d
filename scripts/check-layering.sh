#!/usr/bin/env bash
# DESIGN.md §1: arrows point one way. sched/ and shm/ include nothing of ours beyond their
# own folder; sim/ never includes daemon/ (nor kernels/: the simulator models, not runs).
set -u
cd "$(dirname "$0")/.."
bad=0
check() { # folder, regex of forbidden includes
  local hits
  hits=$(grep -nE "#\s*include\s*\"($2)" "$1"/*.[ch] 2>/dev/null)
  if [ -n "$hits" ]; then echo "layering: $1 must not include $2:"; echo "$hits"; bad=1; fi
}
check sched '\.\./|daemon/|shm/|kernels/|numa/|sim/|libclient/|ringlm\.h'
check shm   '\.\./|daemon/|sched/|kernels/|numa/|sim/|libclient/'
check sim   'daemon/|kernels/|\.\./daemon'
exit $bad
