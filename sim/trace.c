/* ringlm — simulator request traces: readers and transformations. SPDX-License-Identifier: MIT */
#include "sim/trace.h"
#include "sim/err.h"
#include "sim/rng.h"
#include "formats/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_BAD_LIST_MAX 1000

/* ---- container ------------------------------------------------------------------------ */

void sim_trace_init(sim_trace *t, const char *source)
{
    memset(t, 0, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", source ? source : "");
}

void sim_trace_free(sim_trace *t)
{
    free(t->reqs);
    free(t->bad);
    free(t->hashes);
    free(t->costs);
    for (unsigned i = 0; i < t->n_tenants; i++) free(t->tenants[i]);
    for (unsigned i = 0; i < t->n_classes; i++) free(t->classes[i]);
    memset(t, 0, sizeof *t);
}

int sim_trace_push(sim_trace *t, const sim_req *r)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        sim_req *p = realloc(t->reqs, cap * sizeof *p);
        if (!p) return sim_err_setc(-ENOMEM, "out of memory for %zu requests", cap);
        t->reqs = p;
        t->cap = cap;
    }
    t->reqs[t->n++] = *r;
    return 0;
}

int sim_trace_set_cost(sim_trace *t, const sched_cost_state *c, int64_t at_us)
{
    if (!t->n) return sim_err_setc(-EINVAL, "sim_trace_set_cost: no request pushed");
    if (t->n_costs == t->cap_costs) {
        size_t cap = t->cap_costs ? t->cap_costs * 2 : 256;
        sched_cost_state *p = realloc(t->costs, cap * sizeof *p);
        if (!p) return sim_err_setc(-ENOMEM, "out of memory for %zu cost records", cap);
        t->costs = p;
        t->cap_costs = cap;
    }
    t->costs[t->n_costs++] = *c;
    t->reqs[t->n - 1].cost_idx = (uint32_t)t->n_costs;
    t->reqs[t->n - 1].cost_at_us = at_us;
    return 0;
}

int sim_trace_push_hashed(sim_trace *t, const sim_req *r, const uint64_t *ids, uint32_t n,
                          const uint64_t *answer, uint32_t n_answer, uint32_t block_tokens)
{
    sim_req q = *r;
    q.hash_off = q.n_hash = q.n_ahash = q.hash_block_tokens = 0;
    if (!ids) n = 0;
    if (!answer) n_answer = 0;
    if ((n || n_answer) && block_tokens) {
        size_t all = (size_t)n + n_answer;
        if (t->n_hashes + all > UINT32_MAX)
            return sim_err_setc(-E2BIG, "more than 2^32 block hashes in one trace");
        if (t->n_hashes + all > t->cap_hashes) {
            size_t cap = t->cap_hashes ? t->cap_hashes : 4096;
            while (cap < t->n_hashes + all) cap *= 2;
            uint64_t *h = realloc(t->hashes, cap * sizeof *h);
            if (!h) return sim_err_setc(-ENOMEM, "out of memory for %zu block hashes", cap);
            t->hashes = h;
            t->cap_hashes = cap;
        }
        if (n) memcpy(t->hashes + t->n_hashes, ids, (size_t)n * sizeof *ids);
        if (n_answer)
            memcpy(t->hashes + t->n_hashes + n, answer, (size_t)n_answer * sizeof *answer);
        q.hash_off = (uint32_t)t->n_hashes;
        q.n_hash = n;
        q.n_ahash = n_answer;
        q.hash_block_tokens = block_tokens;
        t->n_hashes += all;
    }
    return sim_trace_push(t, &q);
}

int32_t sim_req_token(const sim_trace *t, const sim_req *r, uint64_t uniq, uint32_t pos)
{
    uint32_t hb = r->hash_block_tokens ? r->hash_block_tokens : 1, b = pos / hb;
    uint64_t x = b < r->n_hash + r->n_ahash
                     ? t->hashes[r->hash_off + b] * 0x100000001b3ull + (pos % hb)
                     : (uniq + 0x51ed270b27a1f0c3ull) * 0x9e3779b97f4a7c15ull + pos;
    return (int32_t)(sim_splitmix64(&x) >> 33);
}

void sim_req_tokens(const sim_trace *t, const sim_req *r, uint64_t uniq, int32_t *out)
{
    for (uint32_t k = 0; k < r->prompt_tokens; k++) out[k] = sim_req_token(t, r, uniq, k);
}

static int intern(char **names, unsigned *n, const char *name, const char *what)
{
    for (unsigned i = 0; i < *n; i++)
        if (strcmp(names[i], name) == 0) return (int)i;
    if (*n >= SIM_MAX_NAMES)
        return sim_err_setc(-E2BIG, "more than %d distinct %s names (at \"%s\")", SIM_MAX_NAMES,
                            what, name);
    names[*n] = strdup(name);
    if (!names[*n]) return -ENOMEM;
    return (int)(*n)++;
}

int sim_trace_tenant(sim_trace *t, const char *name)
{
    return intern(t->tenants, &t->n_tenants, name, "tenant");
}
int sim_trace_class(sim_trace *t, const char *name)
{
    return intern(t->classes, &t->n_classes, name, "class");
}

static int cmp_arrival(const void *a, const void *b)
{
    const sim_req *x = a, *y = b;
    if (x->arrival_us != y->arrival_us) return x->arrival_us < y->arrival_us ? -1 : 1;
    /* Ties keep the submission order: src_id is the daemon's request id in a native log
     * (ids are given in the order the loop drained requests, and requests drained in one pass
     * share arrival_us, while the lines are in finish order), the row elsewhere. src_line
     * last: qsort itself is not stable. */
    if (x->src_id != y->src_id) return x->src_id < y->src_id ? -1 : 1;
    return x->src_line < y->src_line ? -1 : x->src_line > y->src_line;
}

void sim_trace_sort(sim_trace *t)
{
    for (size_t i = 1; i < t->n; i++)
        if (cmp_arrival(&t->reqs[i], &t->reqs[i - 1]) <
            0) { /* ties count: a log is in finish order */
            qsort(t->reqs, t->n, sizeof *t->reqs, cmp_arrival);
            return;
        }
}

const char *sim_trace_format_name(int fmt)
{
    return fmt_trace_format_name(fmt);
}

/* ---- bad lines -------------------------------------------------------------------------- */

/* A refused line: an error unless skipping, then listed. Returns 0 to go on, <0 to stop. */
static int bad_line(sim_trace *t, const char *name, uint32_t line, bool skip_bad,
                    const char *reason)
{
    if (!skip_bad) return sim_err_set("%s:%u: %s", name, line, reason);
    t->n_bad_total++;
    if (t->n_bad >= SIM_BAD_LIST_MAX) return 0;
    if (t->n_bad == t->cap_bad) {
        size_t cap = t->cap_bad ? t->cap_bad * 2 : 16;
        sim_bad_line *p = realloc(t->bad, cap * sizeof *p);
        if (!p) return -ENOMEM;
        t->bad = p;
        t->cap_bad = cap;
    }
    t->bad[t->n_bad].line = line;
    snprintf(t->bad[t->n_bad].reason, sizeof t->bad[t->n_bad].reason, "%s", reason);
    t->n_bad++;
    return 0;
}

static void req_defaults(sim_req *r)
{
    memset(r, 0, sizeof *r);
    r->deadline_us = r->cancel_us = SIM_NO_TIME;
    r->real_first_token_us = r->real_finish_us = SIM_NO_TIME;
    r->real_cached_tokens = -1;
}

/* ---- reading (formats/trace.c) --------------------------------------------------------- */

_Static_assert((int)SIM_FMT_AZURE == (int)FMT_TRACE_AZURE &&
                   (int)SIM_FMT_MOONCAKE == (int)FMT_TRACE_MOONCAKE &&
                   (int)SIM_FMT_NATIVE == (int)FMT_TRACE_NATIVE &&
                   (int)SIM_FMT_AUTO == (int)FMT_TRACE_AUTO,
               "sim_trace_format is formats/trace.h's");

/* A native line's recorded request → what the simulator replays. Returns 0, 1 when the line
 * is not replayed (said in why), or -1 with why. */
static int native_req(sim_trace *t, const fmt_request *q, sim_req *r, char *why, size_t wl)
{
    /* A reject only the daemon could decide (a bad token or parameter, draining, out of
     * memory): the simulator cannot decide it, so it replays it as recorded (the same reject
     * event, the same count in the report), whatever the lengths. */
    if (q->finish_reason && q->reject_reason &&
        strcmp(q->finish_reason, sched_end_name(SCHED_END_REJECTED)) == 0)
        for (unsigned w = SCHED_REJECT_BAD_TOKEN; w <= SCHED_REJECT_INTERNAL; w++)
            if (strcmp(q->reject_reason, sched_reject_name((sched_reject_reason)w)) == 0)
                r->daemon_reject = (uint8_t)w;
    /* Any other request the daemon refused before scheduling it can have an empty prompt;
     * there is nothing to replay. */
    if (q->prompt_tokens == 0 && !r->daemon_reject) {
        snprintf(why, wl, "\"prompt_tokens\" is 0 (refused before scheduling): not replayed");
        return 1;
    }
    r->src_id = q->req;
    r->arrival_us = q->arrival_us;
    r->prompt_tokens = (uint32_t)q->prompt_tokens;
    r->output_tokens = (uint32_t)q->output_tokens;
    r->max_tokens = (uint32_t)q->max_tokens;
    if (q->deadline_us != FMT_NULL) r->deadline_us = q->deadline_us;
    if (q->cancel_us != FMT_NULL) r->cancel_us = q->cancel_us;
    if (q->first_token_us != FMT_NULL) r->real_first_token_us = q->first_token_us;
    if (q->finish_us != FMT_NULL) r->real_finish_us = q->finish_us;
    if (q->cached_tokens != FMT_NULL) r->real_cached_tokens = q->cached_tokens;
    r->sample_of = q->sample_of ? q->sample_of + 1 : 0;
    r->logprobs = q->logprobs;
    r->processors = q->processors;
    if (q->finish_reason) {
        for (unsigned c = SCHED_END_LENGTH; c <= SCHED_END_ERROR; c++)
            if (strcmp(q->finish_reason, sched_end_name(c)) == 0) r->real_reason = (uint8_t)c;
        if (!r->real_reason) {
            snprintf(why, wl, "unknown \"finish_reason\" \"%s\"", q->finish_reason);
            return -1;
        }
    }
    /* Only a request that ran to its natural end tells how long its output is; for the others
     * (cancelled, timed out, rejected) replay the length the client asked for, and let the
     * recorded cancel time or the policy cut it short again. */
    if (r->real_reason != SIM_REAL_LENGTH && r->real_reason != SIM_REAL_STOP && r->max_tokens > 0)
        r->output_tokens = r->max_tokens;
    if (r->daemon_reject && r->output_tokens == 0) r->output_tokens = r->max_tokens = 1;
    if (r->output_tokens == 0) {
        snprintf(why, wl, "\"output_tokens\" and \"max_tokens\" are 0");
        return -1;
    }
    if (r->max_tokens < r->output_tokens) r->max_tokens = r->output_tokens;
    int ti = sim_trace_tenant(t, q->tenant && *q->tenant ? q->tenant : "default");
    int ci = sim_trace_class(t, q->class_name && *q->class_name ? q->class_name : "default");
    if (ti < 0 || ci < 0) {
        snprintf(why, wl, "%s", sim_err());
        return -1;
    }
    r->tenant = (uint16_t)ti;
    r->klass = (uint16_t)ci;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ids must be unique in a native trace: fidelity mode matches requests by them */
static int check_unique_ids(const sim_trace *t, const char *name)
{
    for (size_t i = 1; i < t->n; i++)
        if (t->reqs[i].src_id <= t->reqs[i - 1].src_id) {
            /* not sorted by id (finish order): check with a sort of a copy */
            uint64_t *ids = malloc(t->n * sizeof *ids);
            if (!ids) return -ENOMEM;
            for (size_t j = 0; j < t->n; j++) ids[j] = t->reqs[j].src_id;
            qsort(ids, t->n, sizeof *ids, cmp_u64);
            for (size_t j = 1; j < t->n; j++)
                if (ids[j] == ids[j - 1]) {
                    unsigned long long dup = (unsigned long long)ids[j];
                    free(ids);
                    return sim_err_set("%s: request id %llu appears twice", name, dup);
                }
            free(ids);
            break;
        }
    return 0;
}

int sim_trace_parse(sim_trace *t, const char *name, const char *buf, size_t len, int fmt,
                    bool skip_bad)
{
    char why[160];
    fmt_trace_reader rd;
    if (fmt_trace_open(&rd, buf, len, fmt, why, sizeof why) < 0)
        return sim_err_set("%s: %s", name, why);
    fmt = rd.format;
    t->format = fmt;
    snprintf(t->source, sizeof t->source, "%s", name);
    if (fmt == SIM_FMT_NATIVE) {
        t->labelled = true;
        t->has_real = true;
    } else {
        int a = sim_trace_tenant(t, "default"), b = sim_trace_class(t, "default");
        if (a < 0 || b < 0) return -ENOMEM;
    }
    int64_t t0 = 0;
    bool have_t0 = false;
    fmt_request q;
    fmt_request_text text;
    int rc;
    while ((rc = fmt_trace_next(&rd, &q, &text, why, sizeof why)) != 0) {
        sim_req r;
        req_defaults(&r);
        if (rc > 0) {
            if (fmt == SIM_FMT_NATIVE) {
                rc = native_req(t, &q, &r, why, sizeof why);
                if (rc > 0) { /* not replayed: listed, never an error */
                    if ((rc = bad_line(t, name, rd.line, true, why)) < 0) return rc;
                    continue;
                }
            } else {
                /* Azure timestamps are relative to the first data row. */
                if (!have_t0) {
                    t0 = q.arrival_us;
                    have_t0 = true;
                }
                r.arrival_us = q.arrival_us - (fmt == SIM_FMT_AZURE ? t0 : 0);
                r.prompt_tokens = (uint32_t)q.prompt_tokens;
                r.output_tokens = (uint32_t)q.output_tokens;
                r.max_tokens = (uint32_t)q.max_tokens;
                r.src_id = q.req;
                rc = 0;
            }
        }
        if (rc == 0) {
            r.src_line = rd.line;
            if ((rc = sim_trace_push_hashed(t, &r, q.hash_ids, q.n_hash_ids, q.answer_hash_ids,
                                            q.n_answer_hash_ids, q.hash_block_tokens)) < 0)
                return rc;
            if (fmt == SIM_FMT_NATIVE && q.sched_cost) {
                const fmt_sched_cost *c = q.sched_cost;
                sched_cost_state cs = {
                    .step = {c->base_us, c->prefill_token_us, c->decode_seq_us, c->context_token_us,
                             c->prefill_pair_us},
                    .correction = c->correction,
                };
                cs.tier[SCHED_POOL_HOST] = (sched_tier_cost){
                    c->host.out_bytes_per_s, c->host.in_bytes_per_s, c->host.latency_us};
                cs.tier[SCHED_POOL_DISK] = (sched_tier_cost){
                    c->disk.out_bytes_per_s, c->disk.in_bytes_per_s, c->disk.latency_us};
                cs.out_measured[SCHED_POOL_HOST] = c->host.out_measured;
                cs.in_measured[SCHED_POOL_HOST] = c->host.in_measured;
                cs.out_measured[SCHED_POOL_DISK] = c->disk.out_measured;
                cs.in_measured[SCHED_POOL_DISK] = c->disk.in_measured;
                if ((rc = sim_trace_set_cost(t, &cs, c->at_us)) < 0) return rc;
            }
        } else if (rd.fatal || (rc = bad_line(t, name, rd.line, skip_bad, why)) < 0) {
            return rd.fatal ? sim_err_set("%s:%u: %s", name, rd.line, why) : rc;
        }
    }
    if (fmt == SIM_FMT_AZURE) {
        if (rd.line == 0) return sim_err_set("%s: empty file", name);
        /* Rows are sorted in the published files; a row before the first one would be negative. */
        int64_t min = 0;
        for (size_t i = 0; i < t->n; i++)
            if (t->reqs[i].arrival_us < min) min = t->reqs[i].arrival_us;
        for (size_t i = 0; min < 0 && i < t->n; i++) t->reqs[i].arrival_us -= min;
    }
    t->n_torn = rd.torn;
    if (fmt == SIM_FMT_NATIVE && (rc = check_unique_ids(t, name)) < 0) return rc;
    sim_trace_sort(t);
    return 0;
}

int sim_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len)
{
    char why[300];
    int rc = fmt_read_file(path, max_bytes, out, out_len, why, sizeof why);
    return rc < 0 ? sim_err_setc(rc, "%s", why) : 0;
}

int sim_trace_load(sim_trace *t, const char *path, int fmt, bool skip_bad)
{
    char *buf;
    size_t len;
    int rc = sim_read_file(path, SIZE_MAX, &buf, &len);
    if (rc < 0) return rc;
    const char *base = strrchr(path, '/');
    rc = sim_trace_parse(t, base ? base + 1 : path, buf, len, fmt, skip_bad);
    free(buf);
    return rc;
}

/* ---- transformations --------------------------------------------------------------------- */

void sim_transform_defaults(sim_transform *x)
{
    memset(x, 0, sizeof *x);
    x->window_end_s = -1;
    x->rate = 1;
    x->length_scale = 1;
    x->seed = 1;
}

static int64_t scale_time(int64_t us, double rate)
{
    return us == SIM_NO_TIME ? us : (int64_t)llround((double)us / rate);
}

static uint32_t scale_len(uint32_t n, double s)
{
    double v = round((double)n * s);
    return v < 1 ? 1 : v > 0x7fffffff ? 0x7fffffff : (uint32_t)v;
}

int sim_trace_transform(sim_trace *t, const sim_transform *x)
{
    if (!(x->rate > 0) || !isfinite(x->rate))
        return sim_err_set("--rate must be > 0 (is %g)", x->rate);
    if (!(x->length_scale > 0) || !isfinite(x->length_scale))
        return sim_err_set("--length-scale must be > 0 (is %g)", x->length_scale);
    if (x->window_start_s > 0 || x->window_end_s >= 0) {
        if (x->window_end_s >= 0 && x->window_end_s <= x->window_start_s)
            return sim_err_set("--window END (%g) must be after START (%g)", x->window_end_s,
                               x->window_start_s);
        int64_t lo = (int64_t)llround(x->window_start_s * 1e6);
        int64_t hi = x->window_end_s < 0 ? INT64_MAX : (int64_t)llround(x->window_end_s * 1e6);
        size_t k = 0;
        for (size_t i = 0; i < t->n; i++) {
            sim_req r = t->reqs[i];
            if (r.arrival_us < lo || r.arrival_us >= hi) continue;
            r.arrival_us -= lo;
            if (r.cancel_us != SIM_NO_TIME) r.cancel_us -= lo;
            if (r.deadline_us != SIM_NO_TIME) r.deadline_us -= lo;
            if (r.real_first_token_us != SIM_NO_TIME) r.real_first_token_us -= lo;
            if (r.real_finish_us != SIM_NO_TIME) r.real_finish_us -= lo;
            if (r.cost_idx) r.cost_at_us = r.cost_at_us > lo ? r.cost_at_us - lo : 0;
            t->reqs[k++] = r;
        }
        t->n = k;
    }
    if (x->rate != 1)
        for (size_t i = 0; i < t->n; i++) {
            sim_req *r = &t->reqs[i];
            r->arrival_us = scale_time(r->arrival_us, x->rate);
            r->cancel_us = scale_time(r->cancel_us, x->rate);
            r->deadline_us = scale_time(r->deadline_us, x->rate);
            r->real_first_token_us = scale_time(r->real_first_token_us, x->rate);
            r->real_finish_us = scale_time(r->real_finish_us, x->rate);
            if (r->cost_idx) r->cost_at_us = scale_time(r->cost_at_us, x->rate);
        }
    if (x->length_scale != 1)
        for (size_t i = 0; i < t->n; i++) {
            sim_req *r = &t->reqs[i];
            r->prompt_tokens = scale_len(r->prompt_tokens, x->length_scale);
            r->output_tokens = scale_len(r->output_tokens, x->length_scale);
            r->max_tokens = scale_len(r->max_tokens, x->length_scale);
            if (r->n_hash || r->n_ahash)
                r->hash_block_tokens = scale_len(r->hash_block_tokens, x->length_scale);
        }
    int rc;
    if (x->tenant_rule && (rc = sim_trace_assign(t, 0, x->tenant_rule, x->seed)) < 0) return rc;
    if (x->class_rule && (rc = sim_trace_assign(t, 1, x->class_rule, x->seed ^ 0x5bd1e995)) < 0)
        return rc;
    return 0;
}

/* ---- assignment rules ------------------------------------------------------------------- */

#define RULE_MAX 32

int sim_trace_assign(sim_trace *t, int which, const char *rule, uint64_t seed)
{
    const char *what = which ? "--classes" : "--tenants";
    char buf[512];
    if (strlen(rule) >= sizeof buf) return sim_err_set("%s rule is too long", what);
    snprintf(buf, sizeof buf, "%s", rule);
    enum { SWRR, RR, RANDOM, BYLEN } kind = SWRR;
    char *s = buf;
    uint64_t threshold = 0;
    if (strncmp(s, "rr:", 3) == 0) {
        kind = RR;
        s += 3;
    } else if (strncmp(s, "random:", 7) == 0) {
        kind = RANDOM;
        s += 7;
    } else if (strncmp(s, "prompt>", 7) == 0) {
        kind = BYLEN;
        char *e;
        threshold = strtoull(s + 7, &e, 10);
        if (e == s + 7 || *e != ':')
            return sim_err_set("%s \"%s\": expected prompt>N:long,short", what, rule);
        s = e + 1;
    }
    char *names[RULE_MAX];
    double weights[RULE_MAX];
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == RULE_MAX)
            return sim_err_set("%s \"%s\": more than %d names", what, rule, RULE_MAX);
        char *colon = strchr(tok, ':');
        weights[n] = 1;
        if (colon) {
            if (kind == RR || kind == BYLEN)
                return sim_err_set("%s \"%s\": weights are not allowed in this rule", what, rule);
            *colon = 0;
            char *e;
            weights[n] = strtod(colon + 1, &e);
            if (e == colon + 1 || *e || !(weights[n] > 0) || !isfinite(weights[n]))
                return sim_err_set("%s \"%s\": weight of \"%s\" must be a positive number", what,
                                   rule, tok);
        }
        if (!*tok || strlen(tok) > 63)
            return sim_err_set("%s \"%s\": empty or too long name", what, rule);
        names[n++] = tok;
    }
    if (n == 0) return sim_err_set("%s \"%s\": no names", what, rule);
    if (kind == BYLEN && n != 2)
        return sim_err_set("%s \"%s\": prompt>N takes two names", what, rule);
    int idx[RULE_MAX];
    for (int i = 0; i < n; i++) {
        idx[i] = which ? sim_trace_class(t, names[i]) : sim_trace_tenant(t, names[i]);
        if (idx[i] < 0) return idx[i];
    }
    double total = 0, current[RULE_MAX] = {0};
    for (int i = 0; i < n; i++) total += weights[i];
    sim_rng rng;
    sim_rng_seed(&rng, seed);
    for (size_t k = 0; k < t->n; k++) {
        int pick = 0;
        switch (kind) {
        case RR: pick = (int)(k % (size_t)n); break;
        case BYLEN: pick = t->reqs[k].prompt_tokens > threshold ? 0 : 1; break;
        case RANDOM: {
            double u = sim_rng_unif(&rng) * total, acc = 0;
            for (pick = 0; pick < n - 1; pick++) {
                acc += weights[pick];
                if (u < acc) break;
            }
            break;
        }
        case SWRR: /* nginx's smooth weighted round robin: evenly interleaved */
            for (int i = 0; i < n; i++) current[i] += weights[i];
            for (int i = 1; i < n; i++)
                if (current[i] > current[pick]) pick = i;
            current[pick] -= total;
            break;
        }
        if (which)
            t->reqs[k].klass = (uint16_t)idx[pick];
        else
            t->reqs[k].tenant = (uint16_t)idx[pick];
    }
    return 0;
}

void sim_trace_summarise(const sim_trace *t, sim_trace_summary *s)
{
    memset(s, 0, sizeof *s);
    s->n = t->n;
    if (!t->n) return;
    for (size_t i = 0; i < t->n; i++) {
        const sim_req *r = &t->reqs[i];
        s->prompt_total += r->prompt_tokens;
        s->output_total += r->output_tokens;
        if (r->prompt_tokens > s->prompt_max) s->prompt_max = r->prompt_tokens;
        if (r->output_tokens > s->output_max) s->output_max = r->output_tokens;
    }
    s->span_s = (double)(t->reqs[t->n - 1].arrival_us - t->reqs[0].arrival_us) / 1e6;
    s->rate_per_s = s->span_s > 0 ? (double)(t->n - 1) / s->span_s : 0;
    s->prompt_mean = (double)s->prompt_total / (double)t->n;
    s->output_mean = (double)s->output_total / (double)t->n;
}
