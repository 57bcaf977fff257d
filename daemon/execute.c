/* SPDX-License-Identifier: MIT */
/*
 * daemon/execute.c — the scheduler's plan as one flattened engine batch: decode rows and
 * prefill chunks of every planned sequence (a recompute re-prefills the kept prompt and
 * the generated ids), sampled on the engine; the sampled tokens are appended to their
 * requests and become the commit results. Also the warm-up batches before the first client.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "daemon/service_internal.h"

int exec_init(svc *s)
{
    int bs = eng_kv_block_size(s->engine);
    s->ex.bt_stride = (s->mcfg->seq_len + 1 + bs - 1) / bs;
    size_t S = (size_t)s->max_seqs;
    int rc = eng_bb_init(&s->ex.bb, s->max_tokens, s->max_seqs, s->ex.bt_stride, bs);
    if (rc < 0) return rc;
    s->ex.b_out = calloc(S, sizeof(int32_t));
    s->ex.b_samp = calloc(S, sizeof(eng_sampling));
    s->ex.b_rng = calloc(S, sizeof(uint64_t));
    s->ex.b_req = calloc(S, sizeof(svc_req *));
    s->ex.results = calloc(S, sizeof(sched_result));
    if (!s->ex.b_out || !s->ex.b_samp || !s->ex.b_rng || !s->ex.b_req || !s->ex.results)
        return -ENOMEM;
    return 0;
}

void exec_free(svc *s)
{
    eng_bb_free(&s->ex.bb);
    free(s->ex.b_out);
    free(s->ex.b_samp);
    free(s->ex.b_rng);
    free(s->ex.b_req);
    free(s->ex.results);
    s->ex.b_out = NULL;
    s->ex.b_samp = NULL;
    s->ex.b_rng = NULL;
    s->ex.b_req = NULL;
    s->ex.results = NULL;
}

int exec_plan(svc *s, const sched_plan *p, uint64_t *exec_us)
{
    int L = 0, nres = 0;
    eng_batch_builder *bb = &s->ex.bb;
    eng_bb_reset(bb);
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        svc_req *r = req_find(s, e->req);
        uint32_t known = r ? r->n_prompt + r->n_gen : 0;
        /* The scheduler's block ids are the engine's (int32 in the engine's table). */
        if (!r || req_state_ended(r->state) || e->n_tokens == 0 ||
            e->start_pos + e->n_tokens > known ||
            eng_bb_add(bb, r->tokens, e->start_pos, e->n_tokens, (const int32_t *)e->blocks,
                       e->n_blocks, e->samples) < 0) {
            if (r && !req_state_ended(r->state)) {
                /* A plan the service cannot execute would be planned again for ever. */
                svc_log("plan entry for request %llu is not executable (pos %u + %u, known %u, "
                        "%u blocks); failing it",
                        (unsigned long long)e->req, e->start_pos, e->n_tokens, known, e->n_blocks);
                req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                           RINGLM_WIRE_R_INTERNAL);
            }
            continue;
        }
        xfer_check_compute(s, e);
        if (e->samples) {
            s->ex.b_samp[L] = r->samp;
            s->ex.b_rng[L] = r->rng;
            s->ex.b_req[L] = r;
            L++;
        }
        s->ex.results[nres++] =
            (sched_result){.req = e->req, .tokens = 0, .finished = SCHED_FINISH_NONE};
    }
    if (bb->n_seqs == 0) return nres;
    const eng_batch *b = eng_bb_batch(bb);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Clients connecting meanwhile are answered by the loop's handshake thread. */
    dloop_engine_begin(s->loop);
    int rc = eng_execute_sample(s->engine, b, s->ex.b_samp, s->ex.b_rng, s->ex.b_out, NULL);
    dloop_engine_end(s->loop);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *exec_us = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000ll + (t1.tv_nsec - t0.tv_nsec) / 1000);
    /* Tokens exist once the batch ran: stamp them after it, not at the iteration start. */
    svc_clock_advance(s, *exec_us);
    if (rc < 0) {
        s->ex.n_engine_errors++;
        svc_log("engine: %s (batch of %d tokens, %d sequences); failing its requests", eng_errmsg(),
                b->n_tokens, b->n_seqs);
        for (int i = 0; i < nres; i++) {
            svc_req *r = req_find(s, s->ex.results[i].req);
            if (r)
                req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                           RINGLM_WIRE_R_INTERNAL);
        }
        return 0;
    }
    /* Sampled tokens, in the order of the sampling rows. */
    int li = 0;
    for (int i = 0; i < nres && li < L; i++) {
        svc_req *r = s->ex.b_req[li];
        if (r->id != s->ex.results[i].req) continue;
        r->rng = s->ex.b_rng[li];
        int32_t tok = s->ex.b_out[li];
        li++;
        s->ex.results[i].tokens = 1;
        s->ex.results[i].has_token = true; /* the prefix cache keys the answer's blocks */
        s->ex.results[i].token = tok;
        bool stop = false;
        for (int k = 0; k < s->n_stop_tokens; k++) stop |= tok == s->stop_tokens[k];
        stop &= !r->ignore_stop; /* the model's stop tokens only; the request's own always */
        for (uint32_t k = 0; k < r->n_stop_ids; k++) stop |= tok == r->stop_ids[k];
        if (stop) {
            s->ex.results[i].finished = SCHED_FINISH_STOP;
        } else if (r->n_gen >= r->max_new) {
            /* Never past the buffer, whatever the plan said: the request is complete. */
            s->ex.results[i].tokens = 0;
            s->ex.results[i].has_token = false;
            s->ex.results[i].finished = SCHED_FINISH_LENGTH;
        } else {
            r->tokens[r->n_prompt + r->n_gen++] = tok;
            /* Never allocates: admission reserved room for every token it can see. */
            (void)eng_lp_note_output(r->lp, tok);
            if (!r->first_token_us) {
                r->first_token_us = s->now_us;
                metrics_observe_first_token(s->mx, r->n_prompt, s->now_us - r->arrival_us);
            } else {
                metrics_observe_next_token(s->mx, s->now_us - r->last_token_us);
            }
            r->last_token_us = s->now_us;
            if (r->n_gen >= r->max_new || r->n_prompt + r->n_gen >= (uint32_t)s->mcfg->seq_len + 1)
                s->ex.results[i].finished = SCHED_FINISH_LENGTH;
            req_output_ready(s, r);
        }
    }
    return nres;
}

/* One full prefill batch and one full decode batch before the first client: the engine's
 * scratch buffers, the BLAS library's own state and the code are cold at start, and the
 * first request would pay for them (measured: the first 256-token chunk 8-12 ms against
 * ~6 ms in steady state). The KV slots written belong to no request; a request writes its
 * own before it reads them. A failure here is the first request's failure, not start-up's. */
void exec_warm_up(svc *s)
{
    int bs = eng_kv_block_size(s->engine), nblocks = eng_kv_blocks(s->engine);
    int n = s->max_tokens;
    if (n > s->mcfg->seq_len) n = s->mcfg->seq_len;
    if (n > nblocks * bs) n = nblocks * bs;
    if (n < 1 || s->max_seqs < 1) return;
    /* Token 1 everywhere; the prefill's table is blocks 0, 1, ... (its slots are 0..n-1),
     * each decode row q sits alone at position 0 of block q. */
    int n_decode = s->max_seqs < nblocks ? s->max_seqs : nblocks;
    int n_ids = s->ex.bt_stride > n_decode ? s->ex.bt_stride : n_decode;
    int32_t *ones = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_ids);
    if (!ones || !table) {
        free(ones);
        free(table);
        return;
    }
    for (int t = 0; t < n; t++) ones[t] = 1;
    int n_table = s->ex.bt_stride < nblocks ? s->ex.bt_stride : nblocks;
    for (int j = 0; j < n_ids; j++) table[j] = j;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int pass = 0; pass < 2; pass++) {
        eng_bb_reset(&s->ex.bb);
        int S = pass == 0 ? 1 : n_decode;
        if (pass == 0) {
            eng_bb_add(&s->ex.bb, ones, 0, (uint32_t)n, table, (uint32_t)n_table, true);
        } else {
            for (int q = 0; q < S; q++) eng_bb_add(&s->ex.bb, ones, 0, 1, &table[q], 1, true);
        }
        for (int q = 0; q < S; q++) {
            s->ex.b_samp[q] = (eng_sampling){.temperature = 0};
            s->ex.b_rng[q] = 1;
        }
        const eng_batch *b = eng_bb_batch(&s->ex.bb);
        if (eng_execute_sample(s->engine, b, s->ex.b_samp, s->ex.b_rng, s->ex.b_out, NULL) < 0) {
            svc_log("warm-up batch (%d tokens, %d sequences): %s", b->n_tokens, b->n_seqs,
                    eng_errmsg());
            free(ones);
            free(table);
            return;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(ones);
    free(table);
    if (!s->cfg.quiet)
        svc_log("warm-up: %d-token prefill and a decode batch in %.1f ms", n,
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}
