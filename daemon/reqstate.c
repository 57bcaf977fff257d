/* SPDX-License-Identifier: MIT */
/* daemon/reqstate.c — the table of a request's legal moves (reqstate.h) and its one mover. */
#include <stdio.h>

#include "daemon/reqstate.h"

#define B(x) (1u << REQ_##x)
static const uint16_t legal[REQ_STATE__COUNT] = {
    [REQ_ADMITTING] = B(QUEUED) | B(COMPILING) | B(ENDED) | B(ENDED_OUT),
    [REQ_COMPILING] = B(QUEUED) | B(ENDED) | B(ENDED_OUT),
    [REQ_QUEUED] = B(RUNNING) | B(ENDED) | B(ENDED_OUT),
    [REQ_RUNNING] = B(RUNNING_OUT) | B(ENDED) | B(ENDED_OUT),
    [REQ_RUNNING_OUT] = B(RUNNING) | B(RUNNING_BLOCKED) | B(ENDED) | B(ENDED_OUT),
    [REQ_RUNNING_BLOCKED] = B(RUNNING) | B(ENDED) | B(ENDED_OUT),
    [REQ_ENDED_OUT] = B(FINISHED) | B(ENDED),
    [REQ_ENDED] = 0,
    [REQ_FINISHED] = 0,
};
#undef B

static const char *const names[REQ_STATE__COUNT] = {
    [REQ_ADMITTING] = "admitting",     [REQ_COMPILING] = "compiling",
    [REQ_QUEUED] = "queued",           [REQ_RUNNING] = "running",
    [REQ_RUNNING_OUT] = "running_out", [REQ_RUNNING_BLOCKED] = "blocked",
    [REQ_ENDED_OUT] = "ended_out",     [REQ_ENDED] = "ended",
    [REQ_FINISHED] = "finished",
};

const char *req_state_name(unsigned st)
{
    return st < REQ_STATE__COUNT ? names[st] : "?";
}

bool req_state_move(req_state_audit *a, uint64_t req, uint8_t *state, req_state to)
{
    unsigned from = *state;
    bool ok =
        from < REQ_STATE__COUNT && (unsigned)to < REQ_STATE__COUNT && (legal[from] & (1u << to));
    if (!ok) {
        uint64_t n = ++a->illegal;
        if (n == 1) {
            a->first_req = req;
            a->first_from = (uint8_t)from;
            a->first_to = (uint8_t)to;
        }
        if ((n & (n - 1)) == 0)
            fprintf(stderr,
                    "ringlmd: internal error: request %llu moved %s -> %s, which its table "
                    "forbids (%llu such moves so far)\n",
                    (unsigned long long)req, req_state_name(from), req_state_name(to),
                    (unsigned long long)n);
    }
    *state = (uint8_t)to;
    return ok;
}
