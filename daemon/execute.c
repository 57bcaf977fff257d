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
    /* a logits row per token row at most (a prompt whose log-probabilities are wanted) */
    size_t S = (size_t)s->max_seqs, T = (size_t)s->max_tokens;
    int rc = eng_bb_init(&s->ex.bb, s->max_tokens, s->max_seqs, s->ex.bt_stride, bs);
    if (rc < 0) return rc;
    s->ex.b_out = calloc(T, sizeof(int32_t));
    s->ex.b_samp = calloc(T, sizeof(eng_sampling));
    s->ex.b_rng = calloc(T, sizeof(uint64_t));
    s->ex.b_req = calloc(T, sizeof(svc_req *));
    s->ex.b_prompt_pos = calloc(T, sizeof(int32_t));
    s->ex.b_res = calloc(T, sizeof(int32_t));
    s->ex.b_want = calloc(T, sizeof(eng_logprob_want));
    s->ex.b_lp = calloc(T, sizeof(eng_logprobs));
    s->ex.results = calloc(S, sizeof(sched_result));
    s->ex.fork_id = calloc(S, sizeof(uint64_t));
    s->ex.fork_n = calloc(S, sizeof(uint32_t));
    s->ex.fork_ring = calloc(S, sizeof(uint32_t));
    if (!s->ex.fork_id || !s->ex.fork_n || !s->ex.fork_ring) return -ENOMEM;
    if (!s->ex.b_out || !s->ex.b_samp || !s->ex.b_rng || !s->ex.b_req || !s->ex.b_prompt_pos ||
        !s->ex.b_res || !s->ex.b_want || !s->ex.b_lp || !s->ex.results)
        return -ENOMEM;
    s->ex.rings = eng_kv_rings(s->engine) > 0;
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
    free(s->ex.b_prompt_pos);
    free(s->ex.b_res);
    free(s->ex.b_want);
    free(s->ex.b_lp);
    free(s->ex.fork_id);
    free(s->ex.fork_n);
    free(s->ex.fork_ring);
    free(s->ex.snaps);
    free(s->ex.snap_end);
    s->ex.snaps = NULL;
    s->ex.snap_end = NULL;
    s->ex.n_snaps = 0;
    s->ex.fork_id = NULL;
    s->ex.fork_n = NULL;
    s->ex.fork_ring = NULL;
    s->ex.b_prompt_pos = s->ex.b_res = NULL;
    s->ex.b_want = NULL;
    s->ex.b_lp = NULL;
    s->ex.b_out = NULL;
    s->ex.b_samp = NULL;
    s->ex.b_rng = NULL;
    s->ex.b_req = NULL;
    s->ex.results = NULL;
}

/* The prompt rows of entry e whose logits r needs for its prompt's log-probabilities:
 * rows at positions from r->plp_next - 1 (the row before a prompt token predicts it) to
 * the prompt's last token but one, inside the chunk. 0 when it asked for none. */
static uint32_t prompt_lp_rows(const svc_req *r, const sched_entry *e)
{
    if (r->plp_top < 0 || r->plp_next >= r->n_prompt) return 0;
    uint32_t first = r->plp_next - 1, end = e->start_pos + e->n_tokens;
    if (first < e->start_pos) first = e->start_pos;
    return end > first ? end - first : 0;
}

/* ---- n samples on window rings ------------------------------------------------------
 *
 * The samples of one prompt share its global blocks (the prefix cache, copy-on-write), but
 * each runs on a ring of its own, which must start as the leader's did when the prompt was
 * computed: positions the sample's first windows read lie there and nowhere else. The
 * leader's ring is copied once, right after the batch that computed the prompt's last row
 * (the fork), and each sample's first entry copies it into the ring the scheduler gave it —
 * the leader goes on meanwhile, writing over its own ring, or may be gone. A ring is small
 * (one window and a chunk of the windowed layers); the copy is freed with its last sample's
 * first entry (or end). Every position a sample reads is one it wrote or one below the
 * prompt's end, which the copy holds. */
struct svc_ring_copy {
    uint32_t refs;
    size_t bytes;
    unsigned char data[];
};

void exec_ring_copy_put(struct svc_ring_copy *c)
{
    if (c && !--c->refs) free(c);
}

/* ---- ring snapshots ------------------------------------------------------------------
 *
 * The prefix cache's hits for other requests (sched/ringsnap.c): a snapshot slot holds one
 * ring block — the windowed layers' K/V of one cached block, the block of positions
 * [end - bs, end) of the sequence that took it. Position p lives in ring block
 * (p / bs) mod ring_blocks in every ring, so a slot goes back into any ring at the same
 * ring block, and the positions a hitting sequence's windows read below its prefix's end
 * are those the sequences that took them had computed (the same prefix key: the same
 * tokens at the same positions). */
int exec_snap_init(svc *s, int64_t bytes)
{
    const int bs = eng_kv_block_size(s->engine), R = eng_kv_ring_blocks(s->engine);
    const int window = eng_model_hparams_of(s->model)->swa_window;
    if (R <= 0 || bytes < 0) return 0;
    uint32_t w = (uint32_t)((window + bs - 1) / bs);
    if (w > (uint32_t)R) w = (uint32_t)R;
    s->ex.ring_blocks = (uint32_t)R;
    s->ex.snap_blocks = w;
    s->ex.ring_block_bytes = eng_kv_ring_bytes(s->engine) / (size_t)R;
    /* the budget's whole ring blocks; by default the rings' own bytes */
    uint64_t n = bytes ? (uint64_t)bytes / s->ex.ring_block_bytes
                       : (uint64_t)eng_kv_rings(s->engine) * (uint64_t)R;
    if (n > UINT32_MAX / 2) n = UINT32_MAX / 2;
    if (!n) return -ERANGE;
    s->ex.snaps = malloc((size_t)n * s->ex.ring_block_bytes);
    s->ex.snap_end = calloc(n, sizeof(uint32_t));
    if (!s->ex.snaps || !s->ex.snap_end) return -ENOMEM;
    s->ex.n_snaps = (uint32_t)n;
    return 0;
}

/* Copies the ring block of positions [end - bs, end) between ring `ring` and slot `slot`
 * (to the slot when take, else from it). */
static void snap_copy(svc *s, uint32_t slot, uint32_t ring, uint32_t end, bool take)
{
    const size_t rbb = s->ex.ring_block_bytes;
    const uint32_t bs = (uint32_t)eng_kv_block_size(s->engine);
    unsigned char *rb =
        eng_kv_ring_ptr(s->engine, (int)ring) + (size_t)((end / bs - 1) % s->ex.ring_blocks) * rbb;
    unsigned char *sp = s->ex.snaps + (size_t)slot * rbb;
    if (take)
        memcpy(sp, rb, rbb);
    else
        memcpy(rb, sp, rbb);
}

/* Before the entries run (after the transfers started: a swap-out has its ring's bytes):
 * restore the snapshots each hit's first entry starts from. A request whose restore the
 * books disagree on (a slot out of range or holding another block) fails. */
static void snap_restore_all(svc *s, const sched_plan *p)
{
    const uint32_t bs = (uint32_t)eng_kv_block_size(s->engine);
    for (uint32_t k = 0; k < p->n_ring_snapshots; k++) {
        const sched_ring_snapshot *t = &p->ring_snapshots[k];
        svc_req *r = t->restore ? req_find(s, t->req) : NULL;
        if (!r || req_state_ended(r->state)) continue;
        if (t->slot >= s->ex.n_snaps || s->ex.snap_end[t->slot] != t->end || t->end < bs ||
            !eng_kv_ring_ptr(s->engine, (int)t->ring)) {
            svc_log("request %llu: ring snapshot %u holds positions before %u, not %u; "
                    "failing it",
                    (unsigned long long)t->req, t->slot,
                    t->slot < s->ex.n_snaps ? s->ex.snap_end[t->slot] : 0, t->end);
            req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                       RINGLM_WIRE_R_INTERNAL);
            continue;
        }
        snap_copy(s, t->slot, t->ring, t->end, false);
    }
}

/* After the batch ran: the blocks its entries completed (the ring still holds them: a ring
 * spans a window and one batch's rows). A request whose entry was not run has ended
 * (failed) by now: the scheduler frees its slot, never filled. */
static void snap_take_all(svc *s, const sched_plan *p)
{
    for (uint32_t k = 0; k < p->n_ring_snapshots; k++) {
        const sched_ring_snapshot *t = &p->ring_snapshots[k];
        const svc_req *r = req_find(s, t->req);
        if (t->restore || !r || req_state_ended(r->state) || t->slot >= s->ex.n_snaps ||
            !eng_kv_ring_ptr(s->engine, (int)t->ring))
            continue;
        snap_copy(s, t->slot, t->ring, t->end, true);
        s->ex.snap_end[t->slot] = t->end;
    }
}

/* After the batch ran: each leader it forked gives its samples a copy of its ring. */
static void copy_fork_rings(svc *s)
{
    const size_t bytes = eng_kv_ring_bytes(s->engine);
    for (uint32_t f = 0; f < s->ex.n_forks; f++) {
        const void *ring = eng_kv_ring_ptr(s->engine, (int)s->ex.fork_ring[f]);
        struct svc_ring_copy *c = ring ? malloc(sizeof *c + bytes) : NULL;
        if (c) {
            c->refs = 0;
            c->bytes = bytes;
            memcpy(c->data, ring, bytes);
        }
        for (uint32_t i = 0; i < s->ex.fork_n[f]; i++) {
            svc_req *k = req_find(s, s->ex.fork_id[f] + i);
            if (!k || req_state_ended(k->state)) continue;
            if (!c) { /* it could not start where its leader's prompt left the ring */
                svc_log("request %llu: no copy of its leader's window ring (%s); it fails",
                        (unsigned long long)k->id, ring ? "out of memory" : "no ring");
                req_cancel(s, k, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                           RINGLM_WIRE_R_INTERNAL);
                continue;
            }
            k->ring_copy = c;
            c->refs++;
        }
        if (c && !c->refs) free(c);
    }
}

/* r (a leader whose first token this entry samples) forks its other samples: each draws
 * its first token from the same logits row — a repeat of it, with the sample's own seed,
 * processors and log-probabilities — when the batch has the rows for it and the entry is a
 * prefill chunk of two rows or more (a decode-only batch keeps one logits row per
 * sequence). Otherwise they will compute the prompt's last block themselves. Either way
 * they leave r now and are submitted after the commit (adm_submit_samples). Returns the
 * logits rows added. */
static int fork_samples(svc *s, svc_req *r, const sched_entry *e, int L, bool *any_lp)
{
    uint32_t live = 0;
    for (uint32_t i = 1; i < r->n_samples; i++) {
        svc_req *k = req_find(s, r->id + i);
        if (k && !req_state_ended(k->state)) live++;
    }
    r->forked = true;
    s->ex.fork_id[s->ex.n_forks] = r->id + 1;
    s->ex.fork_ring[s->ex.n_forks] = e->ring;
    s->ex.fork_n[s->ex.n_forks++] = r->n_samples - 1;
    if (!live || e->n_tokens < 2 || eng_bb_repeat_logits(&s->ex.bb, live) < 0) return 0;
    int added = 0;
    for (uint32_t i = 1; i < r->n_samples; i++) {
        svc_req *k = req_find(s, r->id + i);
        if (!k || req_state_ended(k->state)) continue;
        k->fork_first = true;
        s->ex.b_req[L + added] = k;
        s->ex.b_res[L + added] = -1; /* no entry of its own: not a scheduler result */
        s->ex.b_samp[L + added] = k->samp;
        s->ex.b_rng[L + added] = k->rng;
        s->ex.b_prompt_pos[L + added] = -1;
        s->ex.b_want[L + added] =
            (eng_logprob_want){.top_n = k->lp_top, .processed = k->lp_processed, .target = -1};
        *any_lp |= k->lp_top >= 0;
        if (k->cons) cn_batch_add(s, k); /* its own matcher's mask, as the leader's */
        added++;
    }
    return added;
}

/* A forked sample's first token, drawn from its leader's row: as a sampled token of its own
 * (execute's loop below), and it starts running. Its constraint (each sample has its own
 * matcher) takes the token first; a failed mask or a refused token ends this sample alone. */
static void fork_token(svc *s, svc_req *k, int li)
{
    k->rng = s->ex.b_rng[li];
    int32_t tok = s->ex.b_out[li];
    k->scheduled_us = s->now_us;
    req_set_state(s, k, REQ_RUNNING);
    char why[200];
    if (tok < 0) snprintf(why, sizeof why, "%s", cn_row_failure(s, k));
    if (tok < 0 || (k->cons && cn_accept(s, k, tok, why, sizeof why) < 0)) {
        cn_count_row_failure(s);
        svc_log("request %llu: %s", (unsigned long long)k->id, why);
        if (k->want_detail && !k->detail) k->detail = strdup(why);
        req_end(s, k, RINGLM_WIRE_R_ERROR, RINGLM_WIRE_R_INTERNAL);
        return;
    }
    bool stop = false;
    for (int j = 0; j < s->n_stop_tokens; j++) stop |= tok == s->stop_tokens[j];
    stop &= !k->ignore_stop;
    for (uint32_t j = 0; j < k->n_stop_ids; j++) stop |= tok == k->stop_ids[j];
    if (stop) {
        req_end(s, k, RINGLM_WIRE_R_STOP, 0);
        return;
    }
    if (k->lp_top >= 0 && lpq_push(&k->lpq, false, tok, 0, &s->ex.b_lp[li], k->lp_processed) < 0)
        svc_log("request %llu: out of memory for log-probabilities", (unsigned long long)k->id);
    k->tokens[k->n_prompt + k->n_gen++] = tok;
    (void)eng_lp_note_output(k->lp, tok);
    k->first_token_us = k->last_token_us = s->now_us;
    /* its prompt was computed once, for the leader: no prompt tokens of its own */
    metrics_observe_first_token(s->mx, 0, s->now_us - k->arrival_us);
    req_output_ready(s, k);
    if (k->n_gen >= k->max_new || k->n_prompt + k->n_gen >= (uint32_t)s->mcfg->seq_len + 1)
        req_end(s, k, RINGLM_WIRE_R_LENGTH, 0);
}

int exec_plan(svc *s, const sched_plan *p, uint64_t *exec_us)
{
    int L = 0, nres = 0;
    bool any_lp = false;
    eng_batch_builder *bb = &s->ex.bb;
    eng_bb_reset(bb);
    s->ex.n_forks = 0;
    cn_batch_reset(s);
    if (p->n_ring_snapshots) snap_restore_all(s, p);
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const sched_entry *e = &p->entries[i];
        svc_req *r = req_find(s, e->req);
        uint32_t known = r ? r->n_prompt + r->n_gen : 0;
        /* logits rows: the sampled one, and before it the prompt rows that want theirs */
        uint32_t n_lrows = r ? prompt_lp_rows(r, e) : 0;
        if (e->samples && n_lrows == 0) n_lrows = 1;
        if (s->ex.rings && e->ring == SCHED_BLOCK_NONE && r && !req_state_ended(r->state)) {
            /* the scheduler gives every sequence holding blocks a ring: never reached */
            svc_log("request %llu: its entry has no window ring; failing it",
                    (unsigned long long)e->req);
            req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                       RINGLM_WIRE_R_INTERNAL);
            continue;
        }
        if (r && r->ring_copy && !req_state_ended(r->state) && e->ring != SCHED_BLOCK_NONE) {
            /* a sample's first entry: its ring starts as its leader's at the fork */
            void *ring = eng_kv_ring_ptr(s->engine, (int)e->ring);
            if (ring) memcpy(ring, r->ring_copy->data, r->ring_copy->bytes);
            exec_ring_copy_put(r->ring_copy);
            r->ring_copy = NULL;
        }
        /* The scheduler's block ids are the engine's (int32 in the engine's table). */
        if (!r || req_state_ended(r->state) || e->n_tokens == 0 ||
            e->start_pos + e->n_tokens > known ||
            eng_bb_add_logits(bb, r->tokens, e->start_pos, e->n_tokens, (const int32_t *)e->blocks,
                              e->n_blocks, n_lrows) < 0 ||
            eng_bb_set_prompt(bb, r->n_prompt) < 0 ||
            (s->ex.rings && eng_bb_set_ring(bb, (int32_t)e->ring) < 0)) {
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
        uint32_t end = e->start_pos + e->n_tokens;
        for (uint32_t k = 0; k < n_lrows; k++) {
            uint32_t pos = end - n_lrows + k;
            bool sampled = e->samples && k == n_lrows - 1;
            s->ex.b_req[L] = r;
            s->ex.b_res[L] = nres;
            if (sampled) {
                s->ex.b_samp[L] = r->samp;
                s->ex.b_rng[L] = r->rng;
                s->ex.b_prompt_pos[L] = -1;
                s->ex.b_want[L] = (eng_logprob_want){
                    .top_n = r->lp_top, .processed = r->lp_processed, .target = -1};
                any_lp |= r->lp_top >= 0;
                if (r->cons) cn_batch_add(s, r); /* its mask, computed during the forward */
            } else {
                /* a prompt row: the log-probability of the prompt token after it */
                bool due = pos + 1 < r->n_prompt && pos + 1 >= r->plp_next;
                s->ex.b_samp[L] = (eng_sampling){.temperature = 0};
                s->ex.b_rng[L] = 1;
                s->ex.b_prompt_pos[L] = (int32_t)pos;
                s->ex.b_want[L] = (eng_logprob_want){.top_n = due ? r->plp_top : -1,
                                                     .no_sample = true,
                                                     .target = due ? r->tokens[pos + 1] : -1};
                any_lp = true;
            }
            L++;
        }
        if (e->samples && r->n_samples > 1 && !r->forked && r->n_gen == 0)
            L += fork_samples(s, r, e, L, &any_lp);
        s->ex.results[nres++] =
            (sched_result){.req = e->req, .tokens = 0, .finished = SCHED_FINISH_NONE};
    }
    if (bb->n_seqs == 0) return nres;
    const eng_batch *b = eng_bb_batch(bb);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Clients connecting meanwhile are answered by the loop's handshake thread; the
     * constrained sequences' masks are computed meanwhile by the mask thread (constrain.c:
     * they depend only on the tokens so far), joined at their first use in sampling. */
    cn_batch_start(s);
    dloop_engine_begin(s->loop);
    int rc = eng_execute_sample_lp(s->engine, b, s->ex.b_samp, s->ex.b_rng, s->ex.b_out,
                                   any_lp ? s->ex.b_want : NULL, s->ex.b_lp);
    dloop_engine_end(s->loop);
    cn_batch_join(s);
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
    if (s->ex.rings) copy_fork_rings(s);
    snap_take_all(s, p);
    /* Logits rows in order: a sequence's prompt rows, then its sampled row. */
    for (int li = 0; li < L; li++) {
        svc_req *r = s->ex.b_req[li];
        if (s->ex.b_res[li] < 0) {
            fork_token(s, r, li);
            continue;
        }
        sched_result *res = &s->ex.results[s->ex.b_res[li]];
        if (s->ex.b_prompt_pos[li] >= 0) {
            uint32_t pos = (uint32_t)s->ex.b_prompt_pos[li];
            if (s->ex.b_want[li].top_n < 0) continue;
            /* out of memory: that token's log-probabilities are lost, not the request */
            if (lpq_push(&r->lpq, true, r->tokens[pos + 1], pos + 1, &s->ex.b_lp[li], false) < 0)
                svc_log("request %llu: out of memory for prompt log-probabilities",
                        (unsigned long long)r->id);
            r->plp_next = pos + 2;
            req_output_ready(s, r);
            continue;
        }
        r->rng = s->ex.b_rng[li];
        int32_t tok = s->ex.b_out[li];
        char why[200];
        /* its constraint stage failed, or its matcher refused the token: this request alone
         * ends, with the detail */
        if (tok < 0) snprintf(why, sizeof why, "%s", cn_row_failure(s, r));
        if (tok < 0 ||
            (r->cons && r->n_gen < r->max_new && cn_accept(s, r, tok, why, sizeof why) < 0)) {
            cn_count_row_failure(s);
            svc_log("request %llu: %s", (unsigned long long)r->id, why);
            if (r->want_detail && !r->detail) r->detail = strdup(why);
            res->tokens = 0;
            req_cancel(s, r, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                       RINGLM_WIRE_R_INTERNAL);
            continue;
        }
        res->tokens = 1;
        res->has_token = true; /* the prefix cache keys the answer's blocks */
        res->token = tok;
        bool stop = false;
        for (int k = 0; k < s->n_stop_tokens; k++) stop |= tok == s->stop_tokens[k];
        stop &= !r->ignore_stop; /* the model's stop tokens only; the request's own always */
        for (uint32_t k = 0; k < r->n_stop_ids; k++) stop |= tok == r->stop_ids[k];
        if (r->max_new == 0) {
            /* Its prompt's log-probabilities were all it wanted (lm-eval's echo scoring): the
             * step that would sample its first token ends it, the token kept by no one. The
             * scheduler, which took it as max_new 1, counts the step as its one token
             * (tokens 0 would be "no progress" and plan it again). */
            res->has_token = false;
            res->finished = SCHED_FINISH_LENGTH;
        } else if (r->n_gen >= r->max_new) {
            /* Never past the buffer, whatever the plan said: the request is complete. */
            res->tokens = 0;
            res->has_token = false;
            res->finished = SCHED_FINISH_LENGTH;
        } else if (stop) {
            res->finished = SCHED_FINISH_STOP;
        } else {
            if (r->lp_top >= 0 &&
                lpq_push(&r->lpq, false, tok, r->n_gen, &s->ex.b_lp[li], r->lp_processed) < 0)
                svc_log("request %llu: out of memory for log-probabilities",
                        (unsigned long long)r->id);
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
                res->finished = SCHED_FINISH_LENGTH;
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
     * each decode row q sits alone at position 0 of block q. With window rings a sequence
     * brings at most ring_rows rows: the prefill is split among sequences of that many, each
     * on a ring of its own and blocks of its own (as many as the rings allow). */
    int n_decode = s->max_seqs < nblocks ? s->max_seqs : nblocks;
    const int rings = eng_kv_rings(s->engine); /* the batches' rows write rings 0, 1, ... */
    if (rings && n_decode > rings) n_decode = rings;
    const int per = rings && s->ex.ring_rows > 0 && s->ex.ring_rows < n ? s->ex.ring_rows : n;
    const int per_blocks = (per + bs - 1) / bs;
    int n_pre = (n + per - 1) / per; /* prefill sequences */
    if (n_pre > (rings ? rings : 1)) n_pre = rings ? rings : 1;
    if (n_pre > s->max_seqs) n_pre = s->max_seqs;
    if (n_pre * per_blocks > nblocks) n_pre = nblocks / per_blocks;
    if (n_pre < 1) return;
    if (n > n_pre * per) n = n_pre * per;
    int n_ids = s->ex.bt_stride > n_decode ? s->ex.bt_stride : n_decode;
    if (n_ids < n_pre * per_blocks) n_ids = n_pre * per_blocks;
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
        int S = pass == 0 ? n_pre : n_decode;
        /* the prefill's rows are a prompt's (the paths a request's take) */
        if (pass == 0 && n_pre == 1) {
            eng_bb_add(&s->ex.bb, ones, 0, (uint32_t)n, table, (uint32_t)n_table, true);
            eng_bb_set_prompt(&s->ex.bb, (uint32_t)n);
            if (rings) eng_bb_set_ring(&s->ex.bb, 0);
        } else if (pass == 0) {
            for (int q = 0; q < S; q++) {
                int rows = n - q * per < per ? n - q * per : per;
                eng_bb_add(&s->ex.bb, ones, 0, (uint32_t)rows, &table[q * per_blocks],
                           (uint32_t)per_blocks, true);
                eng_bb_set_prompt(&s->ex.bb, (uint32_t)rows);
                eng_bb_set_ring(&s->ex.bb, q);
            }
        } else {
            for (int q = 0; q < S; q++) {
                eng_bb_add(&s->ex.bb, ones, 0, 1, &table[q], 1, true);
                if (rings) eng_bb_set_ring(&s->ex.bb, q);
            }
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
        svc_log("warm-up: %d-token prefill (%d sequence%s) and a decode batch in %.1f ms", n, n_pre,
                n_pre > 1 ? "s" : "",
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}
