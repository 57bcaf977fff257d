/* SPDX-License-Identifier: MIT */
/* The runner's request states (daemon/reqstate.h): a request's whole life moves through the
 * table without a complaint, and a move the table forbids is caught — counted, the first
 * one kept, said on stderr — without stopping anything. The runner calls req_state_move
 * only through req_set_state; this suite calls it directly, the test-only entry point. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/reqstate.h"

/* Runs the moves from `from`, returns how many the table refused; *stderr_text gets what
 * the mover said (caller frees). */
static uint64_t walk(req_state_audit *a, uint64_t req, req_state from, const req_state *to, int n,
                     char **stderr_text)
{
    fflush(stderr);
    FILE *cap = tmpfile();
    cr_assert_not_null(cap);
    int saved = dup(STDERR_FILENO);
    cr_assert(saved >= 0);
    cr_assert(dup2(fileno(cap), STDERR_FILENO) >= 0);
    uint8_t st = (uint8_t)from;
    uint64_t before = a->illegal;
    for (int i = 0; i < n; i++) {
        bool ok = req_state_move(a, req, &st, to[i]);
        cr_assert_eq(st, to[i], "the mover moves even an illegal change (the caller has)");
        (void)ok;
    }
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    long len = ftell(cap);
    char *text = calloc(1, (size_t)(len > 0 ? len : 0) + 1);
    rewind(cap);
    if (len > 0) cr_assert_eq(fread(text, 1, (size_t)len, cap), (size_t)len);
    fclose(cap);
    *stderr_text = text;
    return a->illegal - before;
}

Test(reqstate, every_life_a_request_can_have_is_legal)
{
    static const struct {
        const char *what;
        req_state path[10];
        int n;
    } lives[] = {
        {"answered",
         {REQ_QUEUED, REQ_RUNNING, REQ_RUNNING_OUT, REQ_RUNNING, REQ_RUNNING_OUT, REQ_ENDED_OUT,
          REQ_FINISHED},
         7},
        {"rejected by the checks", {REQ_ENDED_OUT, REQ_FINISHED}, 2},
        {"cancelled while queued", {REQ_QUEUED, REQ_ENDED_OUT, REQ_FINISHED}, 3},
        {"blocked, read, then finished",
         {REQ_QUEUED, REQ_RUNNING, REQ_RUNNING_OUT, REQ_RUNNING_BLOCKED, REQ_RUNNING,
          REQ_RUNNING_OUT, REQ_RUNNING_BLOCKED, REQ_ENDED_OUT, REQ_FINISHED},
         9},
        {"its client disconnects mid-answer",
         {REQ_QUEUED, REQ_RUNNING, REQ_RUNNING_OUT, REQ_RUNNING_BLOCKED, REQ_ENDED},
         5},
        {"ended, then its session closes", {REQ_QUEUED, REQ_RUNNING, REQ_ENDED_OUT, REQ_ENDED}, 4},
        {"its constraint compiled, then answered",
         {REQ_COMPILING, REQ_QUEUED, REQ_RUNNING, REQ_ENDED_OUT, REQ_FINISHED},
         5},
        {"its constraint does not compile", {REQ_COMPILING, REQ_ENDED_OUT, REQ_FINISHED}, 3},
        {"its session closes while it compiles", {REQ_COMPILING, REQ_ENDED}, 2},
    };
    for (size_t i = 0; i < sizeof lives / sizeof lives[0]; i++) {
        req_state_audit a = {0};
        char *err = NULL;
        uint64_t bad = walk(&a, 1 + i, REQ_ADMITTING, lives[i].path, lives[i].n, &err);
        cr_expect_eq(bad, 0, "%s: %llu moves refused; stderr: %s", lives[i].what,
                     (unsigned long long)bad, err);
        cr_expect_str_empty(err, "%s: said %s", lives[i].what, err);
        free(err);
    }
}

Test(reqstate, an_illegal_move_is_counted_kept_and_said)
{
    req_state_audit a = {0};
    char *err = NULL;
    /* a finished request revived: its FINISH went out, the client has forgotten the id */
    req_state to[] = {REQ_RUNNING};
    cr_assert_eq(walk(&a, 42, REQ_FINISHED, to, 1, &err), 1);
    cr_expect_eq(a.illegal, 1);
    cr_expect_eq(a.first_req, 42);
    cr_expect_eq(a.first_from, REQ_FINISHED);
    cr_expect_eq(a.first_to, REQ_RUNNING);
    cr_expect_not_null(strstr(err, "request 42 moved finished -> running"), "stderr: %s", err);
    free(err);
}

Test(reqstate, forbidden_moves_are_caught)
{
    static const struct {
        req_state from, to;
        const char *why;
    } bad[] = {
        {REQ_QUEUED, REQ_RUNNING_OUT, "tokens before the scheduler started it"},
        {REQ_ADMITTING, REQ_RUNNING, "started before the scheduler took it"},
        {REQ_COMPILING, REQ_RUNNING, "started while its constraint compiles"},
        {REQ_QUEUED, REQ_COMPILING, "compiled again once in the scheduler"},
        {REQ_ENDED_OUT, REQ_RUNNING, "an ended request running again"},
        {REQ_ENDED_OUT, REQ_RUNNING_BLOCKED, "an ended request reported blocked"},
        {REQ_RUNNING, REQ_RUNNING_BLOCKED, "blocked while nothing waits to go out"},
        {REQ_RUNNING, REQ_FINISHED, "a FINISH pushed before it ended"},
        {REQ_ENDED, REQ_ENDED_OUT, "queued for a session that is closing"},
        {REQ_FINISHED, REQ_FINISHED, "a second FINISH"},
        {REQ_RUNNING, REQ_QUEUED, "the scheduler's preemption is not the runner's state"},
    };
    req_state_audit a = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL;
        req_state to[] = {bad[i].to};
        cr_expect_eq(walk(&a, 100 + i, bad[i].from, to, 1, &err), 1, "%s -> %s (%s) was not caught",
                     req_state_name(bad[i].from), req_state_name(bad[i].to), bad[i].why);
        free(err);
    }
    /* the first one is kept; the log is bounded (first, then powers of two) */
    cr_expect_eq(a.first_req, 100);
    cr_expect_eq(a.illegal, sizeof bad / sizeof bad[0]);
}

Test(reqstate, a_state_out_of_range_is_caught_not_indexed)
{
    req_state_audit a = {0};
    char *err = NULL;
    req_state to[] = {REQ_QUEUED};
    cr_expect_eq(walk(&a, 7, (req_state)200, to, 1, &err), 1);
    cr_expect_not_null(strstr(err, "moved ? -> queued"), "stderr: %s", err);
    free(err);
}
