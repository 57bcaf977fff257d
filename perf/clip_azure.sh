#!/usr/bin/env bash
# clip_azure.sh N < trace.csv > clipped.csv — an Azure LLM inference CSV with every request
# fitted into an N-token context the way `ringlm replay --max-context N` fits it (lengths of
# 0 become 1; where prompt + output > N both shrink by N / (prompt + output), the prompt
# rounded down, the output taking the rest), so ringlm-sim sees the requests a small model's
# daemon is really sent (stories260K: 512).  Used by perf/policy_compare.sh and
# perf/replay_check.sh --max-context.
set -u
N=${1:?usage: clip_azure.sh N < trace.csv > clipped.csv}
awk -F, -v OFS=, -v c="$N" '
NR == 1 { print; next }
{
    p = $2 < 1 ? 1 : $2 + 0; o = $3 < 1 ? 1 : $3 + 0
    if (c > 1 && p + o > c) {
        f = c / (p + o)
        p = int(p * f); if (p < 1) p = 1
        o = c - p; if (o < 1) o = 1
        if (p + o > c) p = c - o
    }
    print $1, p, o
}'
