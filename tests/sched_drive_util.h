/* SPDX-License-Identifier: MIT */
/*
 * tests/sched_drive_util.h — what the scheduler tests that drive a real sched by hand share
 * (header only): the invariant check after every call, and one iteration — step, complete
 * the plan's transfers, execute every entry, commit 1 ms later.
 */
#ifndef RINGLM_TESTS_SCHED_DRIVE_UTIL_H
#define RINGLM_TESTS_SCHED_DRIVE_UTIL_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>

#include "sched/sched.h"

/* The scheduler's invariants hold; a violation fails the test with its description. */
static inline void sd_check(sched *s)
{
    char why[300];
    cr_assert_eq(sched_check_invariants(s, why, sizeof why), 0, "scheduler invariant: %s", why);
}

/* How the plan's cache copies (demotions, reloads) complete in sd_iter. */
typedef struct sd_copies {
    uint64_t dur_us; /* measured duration (their bytes measured with it) */
    int status;      /* 0, or a negative errno: the copy failed */
} sd_copies;

/* One iteration at *now: step; complete every transfer of the plan — at once, or with copies
 * (non-NULL) the cache copies as it says; execute every entry (a token per sampling entry);
 * commit with *now 1 ms later. Invariants checked after every call. Returns the plan (valid
 * until the next step). */
static inline const sched_plan *sd_iter(sched *s, uint64_t *now, const sd_copies *copies)
{
    const sched_plan *pl = sched_step(s, *now);
    cr_assert_not_null(pl, "%s", sched_last_error());
    sd_check(s);
    for (uint32_t i = 0; i < pl->n_transfers; i++) {
        const sched_transfer *t = &pl->transfers[i];
        bool m = copies && t->cache;
        cr_assert_eq(sched_transfer_done(s, t->id, *now, m ? t->bytes : 0, m ? copies->dur_us : 0,
                                         m ? copies->status : 0),
                     0);
        sd_check(s);
    }
    static sched_result res[512];
    uint32_t n = 0;
    for (uint32_t i = 0; i < pl->n_entries && n < 512; i++)
        res[n++] = (sched_result){.req = pl->entries[i].req, .tokens = pl->entries[i].samples};
    *now += 1000;
    cr_assert_eq(sched_commit(s, res, n, *now, 0), 0);
    sd_check(s);
    return pl;
}

#endif
