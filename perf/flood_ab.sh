#!/usr/bin/env bash
# perf/flood_ab.sh — what a hostile local user's floods cost another user, for two daemon
# builds side by side, alternating A and B so drift on the machine hits both alike. Runs the
# security suite's flood tests (tests/test_daemon_security.c: a real ringlmd, the attacker a
# real process under uid 65534, the good client measured in turns with the attack paused and
# running) against each build's ringlmd and collects what they print:
#   - reconnecting reject flood (3 processes: connect, 1,024 rejected requests, disconnect):
#     good client per-token p50 attacked / paused, TTFT max, the daemon's page faults and
#     loop CPU per attacker session, sessions the attacker got through;
#   - 4-session submission flood of one tenant: per-token p50 attacked / paused, TTFT max.
# Needs root (the attacker runs as another uid) and the test program of the CURRENT tree
# (build/tests/test_daemon_security); A and B are bin/ folders with a ringlmd speaking the
# same wire ABI (e.g. a build of main before a change, and this one).
#
#   sudo perf/flood_ab.sh A_BIN B_BIN [ROUNDS]     e.g. /tmp/base/build/bin build/bin 5
#
# Prints one line per figure and build: the median over the rounds and the spread (min-max),
# with the load average at the start and the end. Bounds the tests assert: per-token p50
# within 3x + 0.3 ms of the paused runs', every TTFT under 50 ms, < 128 faults a session (the
# reconnect test turns the connect rate bound off where the daemon has it).
set -euo pipefail
A=${1:?usage: perf/flood_ab.sh A_BIN B_BIN [ROUNDS]}
B=${2:?usage: perf/flood_ab.sh A_BIN B_BIN [ROUNDS]}
ROUNDS=${3:-5}
T=${TEST_BIN:-build/tests/test_daemon_security}
[ -x "$T" ] || { echo "flood_ab: $T not built (make)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for side in A B; do
        bin=$A; [ "$side" = B ] && bin=$B
        RINGLM_BIN=$(cd "$bin" && pwd) "$T" --verbose \
            --filter '*/@(a_reconnecting*|one_tenants*)' >"$out/$side.$r.log" 2>&1 || true
    done
    echo "round $r/$ROUNDS done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$ROUNDS" <<'EOF'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
win = re.compile(r"^(.*) \(window (\d+), \d+ (?:pairs|runs)\): .*TTFT p50 [\d.]+ ms max ([\d.]+) ms .*"
                 r"per-token p50 ([\d.]+) ms \(paused ([\d.]+)\)")
cost = re.compile(r"reconnecting reject flood: (\d+) sessions in ([\d.]+) s.* took (\d+) page faults"
                  r".*? and its loop ([\d.]+) ms of CPU a session")
for side in "AB":
    figs = {}
    for r in range(1, rounds + 1):
        seen = set()
        for line in open(f"{out}/{side}.{r}.log", errors="replace"):
            m = win.match(line)
            if m and m.group(1) not in seen:   # the first window of each attack
                seen.add(m.group(1))
                name = "reconnect" if m.group(1).startswith("reconnecting") else "tenant flood"
                ratio = float(m.group(4)) / float(m.group(5))
                figs.setdefault(f"{name}: per-token attacked/paused", []).append(ratio)
                figs.setdefault(f"{name}: per-token p50 attacked ms", []).append(float(m.group(4)))
                figs.setdefault(f"{name}: TTFT max ms", []).append(float(m.group(3)))
            m = cost.search(line)
            if m:
                figs.setdefault("reconnect: attacker sessions/s", []).append(int(m.group(1)) / float(m.group(2)))
                figs.setdefault("reconnect: daemon faults/session", []).append(float(m.group(3)))
                figs.setdefault("reconnect: loop CPU ms/session", []).append(float(m.group(4)))
        if "[FAIL]" in open(f"{out}/{side}.{r}.log", errors="replace").read():
            figs.setdefault("failed runs", []).append(1)
    for k in sorted(figs):
        v = figs[k]
        if k == "failed runs":
            print(f"{side}  failed runs: {len(v)} of {rounds}")
            continue
        print(f"{side}  {k:42s} median {statistics.median(v):8.3f}  (min {min(v):.3f} max {max(v):.3f}, n={len(v)})")
EOF
