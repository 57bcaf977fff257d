/* SPDX-License-Identifier: MIT */
/*
 * daemon/admission.c — a new request's checks: the per-session limit, draining, the one
 * parameter check (ringlm_wire_check_request: ranges of every parameter), the tenant tag,
 * the class, the context, every prompt token against the vocabulary, the id against the
 * session's requests in flight. A request that fails one is answered at once
 * (rejected, with the wire cause and a detail in the decision log); the rest go to the
 * scheduler, which may still reject them (quota, queue, deadline).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

#include "daemon/service_internal.h"

/* Answers a request the scheduler never saw: rejected for `why_code`, whose cause the client
 * sees (sched_reject_cause). The reject is the scheduler's event like any other
 * (sched_note_reject): the event sink logs it with the one writer and counts it, and the
 * scheduler's stats count it. The class name (and the detail that quotes it) are the
 * client's: the one JSON writer escapes them and repairs invalid UTF-8, so no client can
 * forge a field or a line of the log. */
static void reject_now(svc *s, svc_req *r, sched_reject_reason why_code, const char *why)
{
    s->adm.n_rejects++;
    sched_request sr = {.id = r->id,
                        .tenant = r->tenant,
                        .class_idx = r->class_idx,
                        .class_name = r->class_name,
                        .prompt_len = r->n_prompt,
                        .max_new_tokens = r->max_new,
                        .arrival_us = s->now_us};
    sched_note_reject(s->sched, &sr, why_code, why, s->now_us);
    /* a client that reads details gets the same words in its FINISH */
    if (r->want_detail && why && !r->detail) r->detail = strdup(why);
    req_end(s, r, RINGLM_WIRE_R_REJECTED, (unsigned)sched_reject_cause(why_code));
}

void adm_reject(svc *s, svc_req *r, sched_reject_reason why_code, const char *why)
{
    reject_now(s, r, why_code, why);
}

/* The request's own processors and stop ids from its sampling extensions. 0, or -ENOMEM. */
static int adm_sampling(svc_req *r, const struct ringlm_wire_parsed *rec, uint32_t vocab)
{
    const struct ringlm_wire_sampling *sm = rec->smp;
    if (!sm) return 0;
    eng_logits_params lp = {.bias = (const eng_logit_bias *)rec->bias,
                            .n_bias = (int)sm->n_logit_bias,
                            .repetition_penalty = sm->repetition_penalty,
                            .presence_penalty = sm->presence_penalty,
                            .frequency_penalty = sm->frequency_penalty,
                            .min_p = sm->min_p};
    if (!eng_lp_params_neutral(&lp)) {
        if (!(r->lp = eng_lp_create(&lp))) return -ENOMEM;
        /* Room for every distinct token it can see, so counting never fails mid-decode. */
        uint64_t most = (uint64_t)rec->req->n_prompt + rec->req->max_new_tokens;
        if (most > vocab) most = vocab;
        if (eng_lp_reserve(r->lp, (uint32_t)most) < 0 ||
            eng_lp_note_prompt(r->lp, rec->prompt, rec->req->n_prompt) < 0)
            return -ENOMEM;
        r->samp.proc = r->lp;
    }
    /* log-probabilities: computed with the batch, pushed with their events (execute.c) */
    if (sm->flags & RINGLM_WIRE_SMP_F_LOGPROBS) {
        r->lp_top = (int8_t)sm->top_logprobs;
        r->lp_processed = sm->flags & RINGLM_WIRE_SMP_F_LOGPROBS_PROCESSED;
    }
    if (sm->flags & RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS) {
        r->plp_top = (int8_t)sm->prompt_logprobs;
        r->plp_next = 1; /* nothing predicts the first prompt token */
    }
    if (sm->n_stop_ids) {
        r->stop_ids = malloc(sizeof(int32_t) * sm->n_stop_ids);
        if (!r->stop_ids) return -ENOMEM;
        memcpy(r->stop_ids, rec->stop_ids, sizeof(int32_t) * sm->n_stop_ids);
        r->n_stop_ids = sm->n_stop_ids;
    }
    return 0;
}

void adm_on_request(svc *s, dsess *ds, const struct ringlm_wire_parsed *rec, const char *tenant_tag)
{
    const struct ringlm_wire_request *hdr = rec->req;
    const int32_t *prompt = rec->prompt;
    const uint32_t n_prompt = hdr->n_prompt;
    const char *class_name = rec->class_name;
    svc_sess *ss = dsess_user(ds);
    if (!ss) {
        /* Every request gets its FINISH, even one that slipped past a refused session. */
        dsess_push_finish(ds, hdr->req_id, RINGLM_WIRE_R_REJECTED, RINGLM_WIRE_R_INTERNAL, 0, 0);
        return;
    }
    /* Linked first, so every path below ends through req_end → the same flush. */
    svc_req *r = req_new(s, ss, hdr->req_id);
    if (!r) {
        dsess_push_finish(ds, hdr->req_id, RINGLM_WIRE_R_REJECTED, RINGLM_WIRE_R_INTERNAL, 0, 0);
        return;
    }
    /* n samples: the others are made now, under the next ids, so that whatever ends this
     * one before its prompt is computed (every reject below included) ends them too, each
     * with its own FINISH (req_end). n past the wire's bound is refused by the check. */
    uint32_t n_samples = rec->smp && rec->smp->n > 1 ? rec->smp->n : 1;
    bool samples_oom = false;
    if (n_samples > RINGLM_WIRE_MAX_N) n_samples = 1;
    r->n_samples = 1;
    for (uint32_t i = 1; i < n_samples; i++) {
        svc_req *k = req_new(s, ss, hdr->req_id + i);
        if (!k) {
            samples_oom = true;
            break;
        }
        k->sample_idx = i;
        r->n_samples = i + 1;
    }
    r->n_prompt = n_prompt;
    r->max_new = hdr->max_new_tokens;
    r->arrival_us = s->now_us;
    r->samp = (eng_sampling){.temperature = hdr->temperature,
                             .top_k = (int)hdr->top_k,
                             .top_p = hdr->top_p,
                             .seed = hdr->seed};
    r->rng = eng_rng_init(hdr->seed);
    r->ignore_stop = hdr->flags & RINGLM_WIRE_REQ_F_IGNORE_STOP;
    /* a record with a constraint comes from a library that reads details (shm/wire.h) */
    r->want_detail = rec->smp && rec->smp->constraint_kind;

    /* Tenant: the uid's, unless a trusted uid (a gateway) names one. */
    int tenant = ss->tenant;
    bool bad_tenant = false;
    if (tenant_tag && tenant_tag[0] && ss->trusted) {
        int t = sched_policy_tenant_index(s->policy, tenant_tag);
        if (t >= 0)
            tenant = t;
        else
            bad_tenant = true;
    }
    r->tenant = tenant;
    snprintf(r->tenant_name, sizeof r->tenant_name, "%s", ut_label(s, tenant));
    int ci = sched_policy_class_index(s->policy, class_name && class_name[0] ? class_name : NULL);
    r->class_idx = ci;
    const sched_class_cfg *cc = ci >= 0 ? sched_policy_class(s->policy, ci) : NULL;
    snprintf(r->class_name, sizeof r->class_name, "%s",
             cc ? cc->name : (class_name ? class_name : ""));
    /* Only the policy's classes become metric labels: invented class names would squat the
     * label slots and push real classes of other tenants into "other". */
    r->series = req_series(s, tenant, cc ? ci : -1);

    char why[200];
    int vocab = s->mcfg->vocab_size;
    /* Before every other check: a rejected request counts too until its FINISH is out, so
     * a flood of bad requests is bounded like a flood of good ones. */
    if (ss->n_reqs > SVC_MAX_REQS_PER_SESSION) {
        snprintf(why, sizeof why, "%d requests of this session in flight or undelivered (limit %d)",
                 ss->n_reqs - 1, SVC_MAX_REQS_PER_SESSION);
        reject_now(s, r, SCHED_REJECT_QUEUE_FULL, why);
        return;
    }
    if (s->draining) {
        reject_now(s, r, SCHED_REJECT_DRAINING, "daemon is draining");
        return;
    }
    /* The one parameter check (the client library ran it too; this record may not come from
     * the library). It keeps now + deadline from wrapping. */
    if (ringlm_wire_check_request_smp(hdr, rec->smp ? rec->smp->flags : 0, NULL, why, sizeof why) ||
        ringlm_wire_check_sampling(rec, (uint32_t)vocab, NULL, NULL, why, sizeof why)) {
        reject_now(s, r, SCHED_REJECT_BAD_PARAMS, why);
        return;
    }
    if (bad_tenant) {
        snprintf(why, sizeof why, "tenant tag \"%s\" is not in the policy", tenant_tag);
        reject_now(s, r, SCHED_REJECT_UNKNOWN_TENANT, why);
        return;
    }
    if (!cc) {
        snprintf(why, sizeof why, "class \"%s\" is not in the policy",
                 class_name ? class_name : "");
        reject_now(s, r, SCHED_REJECT_UNKNOWN_CLASS, why);
        return;
    }
    /* The sequence's last token never needs a KV slot, so seq_len + 1 tokens fit. */
    uint64_t max_ctx = (uint64_t)s->mcfg->seq_len + 1;
    if (n_prompt > (uint32_t)s->mcfg->seq_len ||
        (uint64_t)n_prompt + hdr->max_new_tokens > max_ctx) {
        snprintf(why, sizeof why, "prompt %u + max_new_tokens %u exceeds the context of %u tokens",
                 n_prompt, hdr->max_new_tokens, s->mcfg->seq_len);
        reject_now(s, r, SCHED_REJECT_TOO_LONG, why);
        return;
    }
    for (uint32_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= vocab) {
            snprintf(why, sizeof why, "prompt token %u is %d, vocabulary has %d tokens", i,
                     prompt[i], vocab);
            reject_now(s, r, SCHED_REJECT_BAD_TOKEN, why);
            return;
        }
    }
    for (svc_req *o = ss->reqs; o; o = o->s_next) {
        if (o->id >= r->id && o->id < r->id + r->n_samples) continue; /* this request's */
        if (o->client_id >= hdr->req_id && o->client_id - hdr->req_id < n_samples) {
            snprintf(why, sizeof why, "request id %llu is already in flight in this session",
                     (unsigned long long)o->client_id);
            reject_now(s, r, SCHED_REJECT_DUPLICATE, why);
            return;
        }
    }
    if (n_samples > s->cfg.max_n) {
        snprintf(why, sizeof why, "n %u outside [1, %u], this daemon's maximum (--max-n)",
                 n_samples, s->cfg.max_n);
        reject_now(s, r, SCHED_REJECT_BAD_PARAMS, why);
        return;
    }
    if (samples_oom) {
        reject_now(s, r, SCHED_REJECT_INTERNAL, "out of memory");
        return;
    }
    if (n_samples > 1) {
        /* All or nothing: the samples share the prompt's full blocks and need the rest each;
         * a group that could never hold them all at once is refused whole. */
        uint32_t bs = (uint32_t)eng_kv_block_size(s->engine);
        uint64_t one = ((uint64_t)n_prompt + hdr->max_new_tokens + bs - 1) / bs;
        uint64_t shared = n_prompt / bs;
        uint64_t need = one + (uint64_t)(n_samples - 1) * (one - shared);
        uint64_t have = (uint64_t)eng_kv_blocks(s->engine);
        if (need > have) {
            snprintf(why, sizeof why,
                     "n %u samples of %u + %u tokens need %llu KV blocks together, the device "
                     "pool has %llu",
                     n_samples, n_prompt, hdr->max_new_tokens, (unsigned long long)need,
                     (unsigned long long)have);
            reject_now(s, r, SCHED_REJECT_NEVER_FITS, why);
            return;
        }
    }
    r->tokens = malloc(sizeof(int32_t) * ((size_t)n_prompt + hdr->max_new_tokens));
    if (!r->tokens) {
        reject_now(s, r, SCHED_REJECT_INTERNAL, "out of memory");
        return;
    }
    memcpy(r->tokens, prompt, sizeof(int32_t) * n_prompt);
    if (adm_sampling(r, rec, (uint32_t)vocab) < 0) {
        reject_now(s, r, SCHED_REJECT_INTERNAL, "out of memory");
        return;
    }
    if (hdr->deadline_us) r->deadline_us = s->now_us + hdr->deadline_us;

    /* prefix cache: the cache domain of the tenant this daemon decided (SO_PEERCRED, or a
     * trusted gateway's tag) — its own unless the policy groups tenants (cache_domain) — or
     * the uid under the built-in policy; never a value the client chose */
    r->cache_salt = ut_cache_salt(s, tenant, ss->uid);
    /* the other samples: the same request, each with its own seed stream (seed + i),
     * processors, stop ids and log-probabilities */
    for (uint32_t i = 1; i < r->n_samples; i++) {
        svc_req *k = req_find(s, r->id + i);
        k->tenant = r->tenant;
        k->class_idx = r->class_idx;
        k->series = r->series;
        memcpy(k->tenant_name, r->tenant_name, sizeof k->tenant_name);
        memcpy(k->class_name, r->class_name, sizeof k->class_name);
        k->n_prompt = r->n_prompt;
        k->max_new = r->max_new;
        k->arrival_us = r->arrival_us;
        k->deadline_us = r->deadline_us;
        k->cache_salt = r->cache_salt;
        k->ignore_stop = r->ignore_stop;
        k->want_detail = r->want_detail;
        k->samp = r->samp;
        k->samp.proc = NULL;
        k->samp.seed = hdr->seed + i;
        k->rng = eng_rng_init(hdr->seed + i);
        k->tokens = malloc(sizeof(int32_t) * ((size_t)n_prompt + hdr->max_new_tokens));
        if (!k->tokens || adm_sampling(k, rec, (uint32_t)vocab) < 0) {
            reject_now(s, r, SCHED_REJECT_INTERNAL, "out of memory");
            return;
        }
        /* prompt log-probabilities: computed once, by the first sample (ringlm.h) */
        k->plp_top = -1;
        memcpy(k->tokens, prompt, sizeof(int32_t) * n_prompt);
    }
    /* its constraint: compiled already (cached), or compiling off the loop (it waits) */
    sched_reject_reason crr = SCHED_REJECT_NONE;
    int crc = cn_attach(s, r, rec, &crr, why, sizeof why);
    if (crc < 0) {
        reject_now(s, r, crr, why);
        return;
    }
    /* each further sample: its own matcher of the same grammar (the prompt is none of the
     * matcher's: every sample starts where the leader does), ready or waiting with it for the
     * one compile; a failure rejects the group, which ends them all */
    for (uint32_t i = 1; i < r->n_samples; i++) {
        if (cn_attach(s, req_find(s, r->id + i), rec, &crr, why, sizeof why) < 0) {
            reject_now(s, r, crr, why);
            return;
        }
    }
    if (crc > 0) {
        req_set_state(s, r, REQ_COMPILING);
        return;
    }
    adm_submit(s, r);
}

void adm_submit(svc *s, svc_req *r)
{
    sched_request sr = {.id = r->id,
                        .tenant = r->tenant,
                        .class_idx = r->class_idx,
                        .prompt_len = r->n_prompt,
                        /* max_new 0 (prompt log-probabilities only) still runs the step
                         * that ends it; the sampled token is never kept */
                        .max_new_tokens = r->max_new ? r->max_new : 1,
                        .deadline_us = r->deadline_us,
                        .arrival_us = r->arrival_us,
                        /* prompt log-probabilities need every prompt row computed: such a
                         * request neither uses nor fills the prefix cache */
                        .tokens = r->plp_top >= 0 ? NULL : r->tokens,
                        .cache_salt = r->cache_salt,
                        /* n samples: admitted when all their blocks are there together */
                        .n_samples = r->n_samples};
    sched_reject_reason rr = SCHED_REJECT_NONE;
    int rc = sched_submit(s->sched, &sr, s->now_us, &rr);
    if (rc < 0) {
        s->adm.n_rejects++;
        req_end(s, r, RINGLM_WIRE_R_REJECTED, (unsigned)sched_reject_cause(rr));
        return;
    }
    req_set_state(s, r, REQ_QUEUED);
    /* the others wait on its prompt, in no scheduler queue until the fork (one cancelled
     * while its constraint compiled has ended, or is gone) */
    for (uint32_t i = 1; i < r->n_samples; i++) {
        svc_req *k = req_find(s, r->id + i);
        if (k && !req_state_ended(k->state)) req_set_state(s, k, REQ_QUEUED);
    }
}

void adm_submit_samples(svc *s)
{
    for (uint32_t f = 0; f < s->ex.n_forks; f++) {
        for (uint32_t i = 0; i < s->ex.fork_n[f]; i++) {
            svc_req *k = req_find(s, s->ex.fork_id[f] + i);
            if (!k || req_state_ended(k->state)) continue;
            if (k->fork_first && k->n_gen == 0) {
                /* the batch that was to draw its first token failed (its leader failed) */
                req_cancel(s, k, SCHED_CANCEL_ENGINE_ERROR, RINGLM_WIRE_R_ERROR,
                           RINGLM_WIRE_R_INTERNAL);
                continue;
            }
            /* With its first token it continues from the prompt's last row: its known
             * tokens are the prompt and that token, whose blocks the cache holds but for the
             * token's own row (and a partial last block of the prompt). */
            uint32_t first = k->fork_first ? 1 : 0;
            sched_request sr = {.id = k->id,
                                .tenant = k->tenant,
                                .class_idx = k->class_idx,
                                .prompt_len = k->n_prompt + first,
                                .max_new_tokens = k->max_new - first,
                                .deadline_us = k->deadline_us,
                                .arrival_us = k->arrival_us,
                                .tokens = k->tokens,
                                .cache_salt = k->cache_salt,
                                .sample = true,
                                /* the prompt's partial last block: shared, copy-on-write */
                                .sample_of = k->id - k->sample_idx};
            sched_reject_reason rr = SCHED_REJECT_NONE;
            k->sample_starting = true;
            if (sched_submit(s->sched, &sr, s->now_us, &rr) < 0) {
                s->adm.n_rejects++;
                k->forced_reason = 0;
                req_end(s, k, RINGLM_WIRE_R_ERROR, (unsigned)sched_reject_cause(rr));
            }
        }
    }
    s->ex.n_forks = 0;
}
