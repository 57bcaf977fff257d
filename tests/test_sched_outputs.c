/* SPDX-License-Identifier: MIT */
/*
 * test_sched_outputs.c — the scheduler's typed outputs and its one vocabulary.
 *
 *   - every request end is learnt from the outputs alone (sched_cancel's return, the plan's
 *     `ended`, the commit results' `finished`): a scheduler without an event sink reports the
 *     same ends, with the same reasons, as the events of a twin run with a sink;
 *   - the end codes the daemon sends and the request logs write have one spelling: the
 *     scheduler's table and the wire's agree code for code, and each scheduler reason is
 *     spelt like the cause it maps to unless it is a documented finer reason.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tests/event_json.h"
#include "sched/sched.h"
#include "shm/wire.h"

/* ---- the one vocabulary ------------------------------------------------------------------ */

Test(sched_outputs, end_codes_are_the_wire_codes)
{
    for (unsigned c = 0; c < SCHED_END__MAX + 4; c++)
        cr_assert_str_eq(sched_end_name(c), ringlm_wire_reason_name(c), "code %u", c);
    cr_assert_str_eq(sched_end_name(SCHED_END_DEADLINE_INFEASIBLE), "deadline_infeasible");
}

Test(sched_outputs, scheduler_reasons_spelt_like_their_causes)
{
    /* finer than any cause a client sees: documented in sched.h next to the cause */
    static const sched_reject_reason finer[] = {SCHED_REJECT_NONE, SCHED_REJECT_INVALID,
                                                SCHED_REJECT_UNKNOWN_TENANT};
    for (int r = 0; r < SCHED_REJECT__COUNT; r++) {
        bool is_finer = false;
        for (size_t k = 0; k < sizeof finer / sizeof *finer; k++)
            is_finer |= finer[k] == (sched_reject_reason)r;
        sched_end_code c = sched_reject_cause((sched_reject_reason)r);
        if (is_finer) continue;
        cr_assert_geq(c, 16, "reject %s maps to no cause",
                      sched_reject_name((sched_reject_reason)r));
        cr_assert_str_eq(sched_reject_name((sched_reject_reason)r), sched_end_name(c));
    }
    cr_assert_eq(sched_reject_cause(SCHED_REJECT_NEVER_FITS), SCHED_END_NEVER_FITS);
    cr_assert_eq(sched_reject_cause(SCHED_REJECT_INVALID), SCHED_END_BAD_PARAMS);
    cr_assert_str_eq(sched_timeout_name(SCHED_TIMEOUT_PREEMPT),
                     sched_end_name(sched_timeout_cause(SCHED_TIMEOUT_PREEMPT)));
    cr_assert_eq(sched_timeout_cause(SCHED_TIMEOUT_DEADLINE), SCHED_END_NONE);
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_BACKPRESSURE), SCHED_END_OUTPUT_BACKPRESSURE);
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_DISCONNECT), SCHED_END_CLIENT_GONE);
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_SHUTDOWN), SCHED_END_DRAINING);
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_CLIENT), SCHED_END_NONE);
    /* a request the daemon itself failed is not one it drained */
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_KV_READ_FAILED), SCHED_END_INTERNAL);
    cr_assert_eq(sched_cancel_cause(SCHED_CANCEL_ENGINE_ERROR), SCHED_END_INTERNAL);
    cr_assert_str_eq(sched_cancel_name(SCHED_CANCEL_ENGINE_ERROR), "engine_error");
    /* the finish reasons of a request and of the scheduler */
    cr_assert_str_eq(sched_finish_name(SCHED_FINISH_STOP), sched_end_name(SCHED_END_STOP));
    cr_assert_str_eq(sched_finish_name(SCHED_FINISH_LENGTH), sched_end_name(SCHED_END_LENGTH));
}

Test(sched_outputs, event_reason_is_typed)
{
    sched_event e = {.kind = SCHED_EV_TIMEOUT, .timeout = SCHED_TIMEOUT_PREEMPT};
    cr_assert_str_eq(sched_event_reason_name(&e), "deadline_infeasible");
    e = (sched_event){.kind = SCHED_EV_SCHEDULE, .outcome = SCHED_OUTCOME_RESUME};
    cr_assert_str_eq(sched_event_reason_name(&e), "resume");
    e = (sched_event){.kind = SCHED_EV_SWAP_OUT}; /* planned: no reason, no realised cost */
    cr_assert_null(sched_event_reason_name(&e));
    char buf[256];
    cr_assert_geq(event_json(&e, buf, sizeof buf), 0);
    cr_assert_null(strstr(buf, "reason"), "%s", buf);
    cr_assert_null(strstr(buf, "realised_us"), "%s", buf);
    e = (sched_event){.kind = SCHED_EV_ADMIT};
    cr_assert_null(sched_event_reason_name(&e));
}

/* ---- every end from the outputs, with or without a sink ------------------------------------ */

#define N_REQ 40

typedef struct end_rec {
    int kind; /* sched_event_kind of the end, 0 = none yet (ADMIT is never an end) */
    char reason[32];
    uint64_t t_us;
} end_rec;

typedef struct twin {
    end_rec by_event[N_REQ + 1];
    end_rec by_output[N_REQ + 1];
    uint64_t n_events;
} twin;

static void record(end_rec *e, int kind, const char *reason, uint64_t t)
{
    cr_assert_eq(e->kind, 0, "a request ended twice (%d then %d)", e->kind, kind);
    e->kind = kind;
    snprintf(e->reason, sizeof e->reason, "%s", reason);
    e->t_us = t;
}

static void sink(void *ctx, const sched_event *ev)
{
    twin *w = ctx;
    w->n_events++;
    if (ev->kind == SCHED_EV_FINISH || ev->kind == SCHED_EV_CANCEL ||
        ev->kind == SCHED_EV_TIMEOUT) {
        cr_assert(ev->req >= 1 && ev->req <= N_REQ);
        record(&w->by_event[ev->req], ev->kind, sched_event_reason_name(ev), ev->t_us);
    }
}

static const char *policy = "[scheduler]\n"
                            "token_budget = 64\n"
                            "max_active_seqs = 6\n"
                            "prefill_chunk = 32\n"
                            "backpressure_timeout = 5ms\n"
                            "preemption = recompute\n"
                            "[class chat]\n"
                            "priority = 1\n"
                            "[class batch]\n";

/* Request i: prompt, max_new, when the driver reports STOP (0 = never: LENGTH is inferred),
 * deadline after arrival (0 = none), blocked output from (0 = never), client cancel at. */
static void script(uint32_t i, uint32_t *prompt, uint32_t *max_new, uint32_t *stop_at,
                   uint64_t *deadline, uint64_t *block_at, uint64_t *cancel_at)
{
    *prompt = 8 + (i * 7) % 40;
    *max_new = 6 + (i * 5) % 20;
    *stop_at = i % 3 == 0 ? 3 : 0;
    /* steps take 3x what the model predicts: a decode under a deadline admission thought
     * feasible times out */
    *deadline = i % 7 == 1 ? 60000 : 0;
    if (i % 7 == 1) *max_new = 30;
    *block_at = i % 11 == 4 ? 20000 : 0;
    *cancel_at = i % 13 == 5 ? 30000 : 0;
}

static void run(twin *w, bool with_sink)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(policy, &p, &err), 0, "%d %s", err.line, err.reason);
    sched_config cfg = {.kv_blocks_device = 48,
                        .block_size = 16,
                        .kv_bytes_per_token = 64,
                        .max_context = 1024,
                        .step.base_us = 1000,
                        .step.prefill_token_us = 10,
                        .step.decode_seq_us = 10};
    sched *s;
    cr_assert_eq(sched_create(p, &cfg, with_sink ? sink : NULL, w, 1, &s), 0, "%s",
                 sched_last_error());
    uint32_t stop_at[N_REQ + 1], generated[N_REQ + 1] = {0};
    uint64_t block_at[N_REQ + 1], cancel_at[N_REQ + 1], arrival[N_REQ + 1];
    bool live[N_REQ + 1] = {false};
    uint64_t now = 0;
    uint32_t submitted = 0;
    static sched_result res[1024];
    for (int iter = 0; iter < 100000; iter++) {
        while (submitted < N_REQ && (uint64_t)submitted * 1500 <= now) {
            uint32_t i = ++submitted, prompt, max_new;
            uint64_t dl;
            script(i, &prompt, &max_new, &stop_at[i], &dl, &block_at[i], &cancel_at[i]);
            arrival[i] = now;
            sched_request q = {.id = i,
                               .tenant = -1,
                               .class_idx = (int32_t)(i % 2),
                               .prompt_len = prompt,
                               .max_new_tokens = max_new,
                               .deadline_us = dl ? now + dl : 0};
            sched_reject_reason why;
            int rc = sched_submit(s, &q, now, &why);
            cr_assert_eq(rc, 0, "request %u rejected: %s", i, sched_reject_name(why));
            live[i] = true;
        }
        for (uint32_t i = 1; i <= submitted; i++) {
            if (!live[i]) continue;
            if (block_at[i] && now >= arrival[i] + block_at[i]) {
                cr_assert_eq(sched_set_output_blocked(s, i, true, now), 0);
                block_at[i] = 0;
            }
            if (cancel_at[i] && now >= arrival[i] + cancel_at[i]) {
                cancel_at[i] = 0;
                if (sched_cancel(s, i, now, SCHED_CANCEL_CLIENT) == 0) {
                    record(&w->by_output[i], SCHED_EV_CANCEL,
                           sched_cancel_name(SCHED_CANCEL_CLIENT), now);
                    live[i] = false;
                }
            }
        }
        const sched_plan *pl = sched_step(s, now);
        cr_assert(pl);
        for (uint32_t k = 0; k < pl->n_ended; k++) {
            const sched_ended *e = &pl->ended[k];
            cr_assert(e->kind == SCHED_EV_TIMEOUT || e->kind == SCHED_EV_CANCEL);
            record(&w->by_output[e->req], e->kind,
                   e->kind == SCHED_EV_TIMEOUT ? sched_timeout_name(e->timeout)
                                               : sched_cancel_name(e->cancel),
                   pl->now_us);
            live[e->req] = false;
        }
        uint32_t n = 0;
        for (uint32_t k = 0; k < pl->n_entries; k++) {
            const sched_entry *e = &pl->entries[k];
            res[n] = (sched_result){.req = e->req, .tokens = e->samples ? 1 : 0};
            if (e->samples && ++generated[e->req] == stop_at[e->req])
                res[n].finished = SCHED_FINISH_STOP;
            n++;
        }
        now += 3 * (1000 + 10 * (uint64_t)(pl->prefill_tokens + pl->decode_tokens));
        if (n) {
            cr_assert_eq(sched_commit(s, res, n, now, 0), 0);
            for (uint32_t k = 0; k < n; k++) {
                if (res[k].finished == SCHED_FINISH_NONE) continue;
                record(&w->by_output[res[k].req], SCHED_EV_FINISH,
                       sched_finish_name(res[k].finished), now);
                live[res[k].req] = false;
            }
        }
        bool any = submitted < N_REQ;
        for (uint32_t i = 1; i <= N_REQ && !any; i++) any = live[i];
        if (!any) break;
    }
    sched_counts c;
    sched_get_counts(s, &c);
    cr_assert_eq(c.waiting + c.running + c.swapped + c.in_transit, 0, "requests left live");
    sched_destroy(s);
    sched_policy_free(p);
}

Test(sched_outputs, every_end_known_without_a_sink)
{
    static twin a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    run(&a, true);
    run(&b, false);
    cr_assert_gt(a.n_events, 0);
    cr_assert_eq(b.n_events, 0);
    int seen[SCHED_EV__COUNT] = {0}, stops = 0, lengths = 0, bp = 0;
    for (uint32_t i = 1; i <= N_REQ; i++) {
        const end_rec *x = &a.by_event[i], *y = &b.by_output[i], *z = &a.by_output[i];
        cr_assert_neq(x->kind, 0, "request %u never ended", i);
        /* the sink-less run learns the same end, reason and time from its outputs */
        cr_assert_eq(y->kind, x->kind, "request %u: %d vs %d", i, y->kind, x->kind);
        cr_assert_str_eq(y->reason, x->reason, "request %u", i);
        cr_assert_eq(y->t_us, x->t_us, "request %u", i);
        cr_assert_eq(z->kind, x->kind, "request %u", i); /* and so does the run with a sink */
        seen[x->kind]++;
        stops += !strcmp(x->reason, "stop");
        lengths += !strcmp(x->reason, "length");
        bp += !strcmp(x->reason, "backpressure");
    }
    /* the script reaches every way to end */
    cr_assert_gt(stops, 0);
    cr_assert_gt(lengths, 0);
    cr_assert_gt(seen[SCHED_EV_TIMEOUT], 0);
    cr_assert_gt(bp, 0);
    cr_assert_gt(seen[SCHED_EV_CANCEL], bp);
}

/* ---- the caller's own rejects are events of the one stream ------------------------------ */

static sched_event noted;
static int n_noted;
static char noted_detail[64];
static void note_sink(void *ctx, const sched_event *e)
{
    (void)ctx;
    noted = *e;
    snprintf(noted_detail, sizeof noted_detail, "%s", e->detail ? e->detail : "(null)");
    n_noted++;
}

/* A request the daemon refused before submitting it (sched_note_reject) is a REJECT event
 * with its reason and detail, counted in its tenant's stats; the scheduler takes nothing. */
Test(sched_outputs, a_callers_reject_is_an_event_and_counted)
{
    sched_policy *p;
    sched_policy_error err;
    cr_assert_eq(sched_policy_parse(policy, &p, &err), 0, "%d %s", err.line, err.reason);
    sched_config cfg = {.kv_blocks_device = 48,
                        .block_size = 16,
                        .kv_bytes_per_token = 64,
                        .max_context = 1024,
                        .step.base_us = 1000,
                        .step.prefill_token_us = 10,
                        .step.decode_seq_us = 10};
    sched *s;
    cr_assert_eq(sched_create(p, &cfg, note_sink, NULL, 1, &s), 0, "%s", sched_last_error());
    sched_request q = {.id = 9,
                       .tenant = -1,
                       .tenant_name = NULL,
                       .class_idx = -1,
                       .class_name = "no-such-class",
                       .prompt_len = 4,
                       .max_new_tokens = 8};
    n_noted = 0;
    cr_assert_eq(sched_note_reject(s, &q, SCHED_REJECT_BAD_TOKEN, "prompt token 2 is 9999", 5), 0,
                 "%s", sched_last_error());
    cr_assert_eq(n_noted, 1);
    cr_expect_eq(noted.kind, SCHED_EV_REJECT);
    cr_expect_eq(noted.req, 9);
    cr_expect_eq(noted.t_us, 5);
    cr_expect_eq(noted.reject, SCHED_REJECT_BAD_TOKEN);
    cr_expect_str_eq(noted_detail, "prompt token 2 is 9999");
    cr_expect_eq(sched_reject_cause(noted.reject), SCHED_END_BAD_TOKEN);
    sched_counts c;
    sched_get_counts(s, &c);
    cr_expect_eq(c.waiting + c.running, 0, "the scheduler took the refused request");
    cr_expect_eq(sched_note_reject(s, &q, SCHED_REJECT_NONE, NULL, 6), -EINVAL);
    cr_expect_eq(sched_note_reject(s, &q, SCHED_REJECT__COUNT, NULL, 6), -EINVAL);
    cr_expect_eq(n_noted, 1);
    sched_destroy(s);
    sched_policy_free(p);
}
