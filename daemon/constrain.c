/* SPDX-License-Identifier: MIT */
/*
 * daemon/constrain.c — structured output at serving time: a request's constraint (JSON
 * Schema, any JSON object, a regular expression, a choice; shm/wire.h) compiled once, off the
 * loop thread, and enforced token by token as the constraint stage of the request's logits
 * pipeline (kernels/logits.h).
 *
 *   vocabulary   one cst_vocab built at start from the model's tokenizer (a GGUF model's own,
 *                or --tokenizer for a llama2.c checkpoint), whose end tokens are the daemon's
 *                stop tokens: a stop token is allowed only where the text so far is complete.
 *                Without a tokenizer the daemon enforces no constraint and says so in its
 *                handshake (no RINGLM_WIRE_CAP_CONSTRAINT).
 *   compile      on a compile thread. Compiled grammars are cached by content (XXH3 of the
 *                kind and the bytes, bytes compared on a hit), at most CN_CACHE_ENTRIES and
 *                CN_CACHE_BYTES, least recently used first out (an entry in use stays). A
 *                request whose grammar is not ready waits in REQ_COMPILING, outside the
 *                scheduler: the loop never waits for a compile. The compile thread wakes the
 *                loop through an eventfd read armed on the loop's ring. A compile error (or a
 *                grammar over CST_MAX_PROGRAM, or one that would take over CST_MAX_COMPILE_WORK
 *                steps to analyse, or a source over the record's 256 KiB) rejects the request
 *                with bad_params, the compiler's words in the decision log and in the
 *                request's FINISH detail (RINGLM_WIRE_EV_DETAIL). Failures are cached too. The
 *                bounds are steps and sizes, not clocks: a pathological grammar is refused in
 *                a bounded time (well under a second here), so the compiles queued behind it
 *                and the loop go on.
 *   mask         each constrained sequence owns a matcher (reset matchers are pooled per
 *                grammar: what a matcher learnt of the grammar — its DFA states and masks —
 *                serves the next request). The masks of a step depend only on the tokens so
 *                far, so a mask thread computes them while the engine runs the forward pass
 *                (cn_batch_start before the batch, cn_batch_join at the first mask use); the
 *                stage sets every disallowed logit to -inf and puts the row back after the
 *                token is picked. A mask that fails (out of memory, nothing allowed) fails that
 *                row alone: the request ends with an error and a detail.
 *   advance      the loop thread accepts each sampled token into the matcher after the step.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "constrain/cst.h"
#include "daemon/service_internal.h"
#include "model/tokenizer.h"

#define CN_BUCKETS        256
#define CN_CACHE_ENTRIES  128
#define CN_CACHE_BYTES    (256u << 20)
#define CN_MAX_COMPILING  64 /* distinct grammars queued or compiling */
#define CN_POOL_PER_ENTRY 32 /* idle matchers kept per grammar */
#define CN_POOL_TOTAL     64
#define CN_BYTES_PER_INSN 16 /* a compiled instruction's share of memory, for the bound */
#define SVC_CONSTRAIN_TAG (DLOOP_UD_SVC | (1ull << 61))

enum { CN_COMPILING, CN_READY, CN_FAILED };

typedef struct cn_entry cn_entry;
typedef struct svc_cons svc_cons;

struct cn_entry {
    uint64_t hash;
    uint32_t kind;
    uint8_t *src;
    uint32_t n_src;
    int state;
    cst_grammar *g;
    char err[RINGLM_WIRE_DETAIL_MAX];
    size_t cost;   /* bytes charged to the cache */
    uint32_t refs; /* requests holding it (waiting or running) */
    cn_entry *h_next, *lru_prev, *lru_next, *q_next;
    svc_cons *waiters; /* requests waiting for the compile */
    cst_matcher **idle;
    uint32_t n_idle;
    /* written by the compile thread, read by the loop after the handoff */
    int rc;
    cst_grammar *g_new;
    uint64_t compile_us;
};

/* A request's constraint: its grammar, its matcher, this step's mask. */
struct svc_cons {
    struct cn_state *st;
    svc_req *r;
    cn_entry *e;
    cst_matcher *m; /* NULL while the grammar compiles */
    uint32_t *mask; /* the next token's mask (the mask thread's during a step) */
    float *saved;   /* the row's values before the mask, for undo */
    int mask_rc;    /* cst_matcher_mask's result for this step */
    bool masked;    /* mask holds this step's mask */
    bool waiting;   /* linked in e->waiters */
    svc_cons *w_prev, *w_next;
    char fail[160];
};

typedef struct cn_state {
    cst_vocab *vocab;
    int32_t stops[SVC_MAX_STOP_TOKENS]; /* the vocabulary's end tokens: the stop tokens */
    int n_stops;
    uint32_t kinds;
    size_t words;
    int vocab_n;
    /* cache */
    cn_entry *hash[CN_BUCKETS];
    cn_entry *lru_head, *lru_tail;
    uint32_t n_entries, n_compiling, n_idle;
    size_t bytes;
    /* compile thread */
    pthread_t compile_th;
    bool compile_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cn_entry *todo_head, *todo_tail, *done_head;
    int efd;
    uint64_t efd_val;
    bool efd_armed;
    /* mask thread */
    pthread_t mask_th;
    bool mask_started;
    pthread_mutex_t mmu;
    pthread_cond_t mcv, mdone;
    svc_cons **batch;
    int n_batch, cap_batch;
    uint64_t gen, done_gen;
    bool pending; /* a batch was started and not joined */
    /* figures (stats file) */
    uint64_t n_hits, n_compiled, n_errors, n_row_failures;
    uint64_t mask_ns, mask_rows, wait_ns;
} cn_state;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *kind_name(uint32_t k)
{
    switch (k) {
    case RINGLM_WIRE_CONSTRAINT_JSON_SCHEMA: return "json_schema";
    case RINGLM_WIRE_CONSTRAINT_JSON_OBJECT: return "json_object";
    case RINGLM_WIRE_CONSTRAINT_REGEX: return "regex";
    case RINGLM_WIRE_CONSTRAINT_GRAMMAR: return "grammar";
    case RINGLM_WIRE_CONSTRAINT_CHOICE: return "choice";
    case RINGLM_WIRE_CONSTRAINT_PYTHON_CALLS: return "python_calls";
    default: return "unknown";
    }
}

/* ---- vocabulary ------------------------------------------------------------------------ */

static bool is_gguf(const char *path)
{
    char magic[4];
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool yes = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    fclose(f);
    return yes;
}

int cn_create(svc *s, char *why, size_t len)
{
    cn_state *st = calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    st->efd = -1;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    pthread_mutex_init(&st->mmu, NULL);
    pthread_cond_init(&st->mcv, NULL);
    pthread_cond_init(&st->mdone, NULL);
    s->cn = st;
    const char *path = NULL;
    tok_tokenizer *t = NULL;
    int rc = 0;
    if (s->cfg.tokenizer) {
        path = s->cfg.tokenizer;
        rc = is_gguf(path) ? tok_load_gguf(path, s->mcfg->vocab_size, &t)
                           : tok_load(path, s->mcfg->vocab_size, &t);
    } else if (s->cfg.model && is_gguf(s->cfg.model)) {
        path = s->cfg.model;
        rc = tok_load_gguf(path, s->mcfg->vocab_size, &t);
    }
    if (rc < 0) {
        snprintf(why, len, "tokenizer %s: %s", path, tok_errmsg());
        return rc;
    }
    if (!t) return 0; /* no tokenizer: no constraints (the handshake says so) */
    /* the end tokens are the daemon's stop tokens (those that end a request here), and only
     * those; the model's vocabulary size bounds the tokens */
    rc = cst_vocab_from_tokenizer_ends(t, s->mcfg->vocab_size, s->stop_tokens, s->n_stop_tokens,
                                       &st->vocab);
    tok_free(t);
    if (rc < 0) {
        snprintf(why, len, "constraint vocabulary: %s", strerror(-rc));
        return rc;
    }
    st->vocab_n = cst_vocab_size(st->vocab);
    for (int k = 0; k < s->n_stop_tokens; k++) st->stops[st->n_stops++] = s->stop_tokens[k];
    st->words = cst_mask_words(st->vocab);
    st->kinds = 1u << RINGLM_WIRE_CONSTRAINT_JSON_SCHEMA |
                1u << RINGLM_WIRE_CONSTRAINT_JSON_OBJECT | 1u << RINGLM_WIRE_CONSTRAINT_REGEX |
                1u << RINGLM_WIRE_CONSTRAINT_CHOICE | 1u << RINGLM_WIRE_CONSTRAINT_GRAMMAR |
                1u << RINGLM_WIRE_CONSTRAINT_PYTHON_CALLS;
    return 0;
}

uint32_t cn_kinds(const svc *s)
{
    return s->cn ? s->cn->kinds : 0;
}

/* ---- compile thread ---------------------------------------------------------------------- */

static int compile_entry(cn_entry *e, cst_grammar **g, char *err, size_t errlen)
{
    switch (e->kind) {
    case RINGLM_WIRE_CONSTRAINT_JSON_SCHEMA:
        return cst_compile_json_schema((const char *)e->src, e->n_src, g, err, errlen);
    case RINGLM_WIRE_CONSTRAINT_JSON_OBJECT: return cst_compile_json_value(true, g, err, errlen);
    case RINGLM_WIRE_CONSTRAINT_REGEX:
        return cst_compile_regex((const char *)e->src, e->n_src, g, err, errlen);
    case RINGLM_WIRE_CONSTRAINT_GRAMMAR:
        return cst_compile_gbnf((const char *)e->src, e->n_src, g, err, errlen);
    case RINGLM_WIRE_CONSTRAINT_PYTHON_CALLS:
        return cst_compile_python_calls((const char *)e->src, e->n_src, g, err, errlen);
    case RINGLM_WIRE_CONSTRAINT_CHOICE: {
        /* alternatives separated by NUL bytes */
        int n = 1;
        for (uint32_t i = 0; i < e->n_src; i++) n += e->src[i] == 0;
        const char **c = malloc(sizeof *c * (size_t)n);
        size_t *l = malloc(sizeof *l * (size_t)n);
        if (!c || !l) {
            free(c);
            free(l);
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        int k = 0;
        uint32_t at = 0;
        for (uint32_t i = 0; i <= e->n_src; i++) {
            if (i == e->n_src || e->src[i] == 0) {
                c[k] = (const char *)e->src + at;
                l[k++] = i - at;
                at = i + 1;
            }
        }
        int rc = cst_compile_choice(c, l, n, g, err, errlen);
        free(c);
        free(l);
        return rc;
    }
    default:
        snprintf(err, errlen, "kind %s is not implemented by this daemon", kind_name(e->kind));
        return -ENOTSUP;
    }
}

static void *compile_main(void *arg)
{
    svc *s = arg;
    cn_state *st = s->cn;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->stop && !st->todo_head) pthread_cond_wait(&st->cv, &st->mu);
        if (st->stop) break;
        cn_entry *e = st->todo_head;
        st->todo_head = e->q_next;
        if (!st->todo_head) st->todo_tail = NULL;
        pthread_mutex_unlock(&st->mu);
        uint64_t t0 = mono_ns();
        char err[RINGLM_WIRE_DETAIL_MAX] = "";
        cst_grammar *g = NULL;
        int rc = compile_entry(e, &g, err, sizeof err);
        if (rc < 0 && !err[0]) snprintf(err, sizeof err, "%s", strerror(-rc));
        pthread_mutex_lock(&st->mu);
        e->rc = rc;
        e->g_new = rc < 0 ? NULL : g;
        if (rc < 0) memcpy(e->err, err, sizeof err);
        e->compile_us = (mono_ns() - t0) / 1000;
        e->q_next = st->done_head;
        st->done_head = e;
        pthread_mutex_unlock(&st->mu);
        uint64_t one = 1;
        if (write(st->efd, &one, sizeof one) < 0) { /* the counter cannot overflow here */
        }
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ---- mask thread ------------------------------------------------------------------------- */

static void *mask_main(void *arg)
{
    cn_state *st = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&st->mmu);
    for (;;) {
        /* stop is written under mu (the compile thread's lock), so it is read atomically
         * here; cn_stop broadcasts mcv under mmu after writing it */
        while (!__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE) && st->gen == seen)
            pthread_cond_wait(&st->mcv, &st->mmu);
        if (__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE)) break;
        seen = st->gen;
        int n = st->n_batch;
        svc_cons **b = st->batch;
        pthread_mutex_unlock(&st->mmu);
        uint64_t t0 = mono_ns();
        for (int i = 0; i < n; i++) {
            b[i]->mask_rc = cst_matcher_mask(b[i]->m, b[i]->mask);
            b[i]->masked = true;
        }
        uint64_t dt = mono_ns() - t0;
        pthread_mutex_lock(&st->mmu);
        st->mask_ns += dt;
        st->mask_rows += (uint64_t)n;
        st->done_gen = seen;
        pthread_cond_broadcast(&st->mdone);
    }
    pthread_mutex_unlock(&st->mmu);
    return NULL;
}

static void arm_efd(svc *s)
{
    cn_state *st = s->cn;
    if (st->efd_armed || st->efd < 0 || !s->loop) return;
    struct io_uring_sqe *sqe = dloop_sqe(s->loop);
    if (!sqe) return;
    io_uring_prep_read(sqe, st->efd, &st->efd_val, sizeof st->efd_val, 0);
    io_uring_sqe_set_data64(sqe, SVC_CONSTRAIN_TAG);
    st->efd_armed = true;
}

int cn_start(svc *s)
{
    cn_state *st = s->cn;
    if (!st || !st->kinds) return 0;
    st->efd = eventfd(0, EFD_CLOEXEC);
    if (st->efd < 0) return -errno;
    if (pthread_create(&st->compile_th, NULL, compile_main, s) != 0) return -EAGAIN;
    st->compile_started = true;
    if (pthread_create(&st->mask_th, NULL, mask_main, st) != 0) return -EAGAIN;
    st->mask_started = true;
    arm_efd(s);
    return 0;
}

void cn_stop(svc *s)
{
    cn_state *st = s->cn;
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    __atomic_store_n(&st->stop, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_lock(&st->mmu);
    pthread_cond_broadcast(&st->mcv);
    pthread_mutex_unlock(&st->mmu);
    if (st->compile_started) pthread_join(st->compile_th, NULL);
    if (st->mask_started) pthread_join(st->mask_th, NULL);
    st->compile_started = st->mask_started = false;
    st->efd_armed = false; /* the loop's ring is gone with its reads */
}

/* ---- cache ------------------------------------------------------------------------------- */

static void lru_unlink(cn_state *st, cn_entry *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else
        st->lru_head = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    else
        st->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_front(cn_state *st, cn_entry *e)
{
    e->lru_prev = NULL;
    e->lru_next = st->lru_head;
    if (st->lru_head) st->lru_head->lru_prev = e;
    st->lru_head = e;
    if (!st->lru_tail) st->lru_tail = e;
}

static void entry_free(cn_state *st, cn_entry *e)
{
    for (uint32_t i = 0; i < e->n_idle; i++) cst_matcher_free(e->idle[i]);
    st->n_idle -= e->n_idle;
    free(e->idle);
    cst_grammar_free(e->g);
    free(e->src);
    free(e);
}

static void entry_drop(cn_state *st, cn_entry *e)
{
    cn_entry **pp = &st->hash[e->hash % CN_BUCKETS];
    while (*pp && *pp != e) pp = &(*pp)->h_next;
    if (*pp) *pp = e->h_next;
    lru_unlink(st, e);
    st->n_entries--;
    st->bytes -= e->cost;
    entry_free(st, e);
}

/* Least recently used first, entries nobody holds, until the cache is within its bounds. */
static void evict(cn_state *st)
{
    cn_entry *e = st->lru_tail;
    while (e && (st->n_entries > CN_CACHE_ENTRIES || st->bytes > CN_CACHE_BYTES)) {
        cn_entry *prev = e->lru_prev;
        if (!e->refs && e->state != CN_COMPILING) entry_drop(st, e);
        e = prev;
    }
}

/* ---- the constraint stage (kernels/logits.h) ----------------------------------------------- */

static void cn_join(cn_state *st)
{
    if (!st->pending) return;
    uint64_t t0 = mono_ns();
    pthread_mutex_lock(&st->mmu);
    while (st->done_gen != st->gen) pthread_cond_wait(&st->mdone, &st->mmu);
    pthread_mutex_unlock(&st->mmu);
    st->wait_ns += mono_ns() - t0;
    st->pending = false;
}

static int stage_mask(void *ctx, float *logits, int vocab)
{
    svc_cons *c = ctx;
    cn_state *st = c->st;
    cn_join(st);
    if (!c->masked) { /* not in the step's batch: computed here */
        c->mask_rc = cst_matcher_mask(c->m, c->mask);
        c->masked = true;
    }
    if (c->mask_rc < 0) {
        snprintf(c->fail, sizeof c->fail, "constraint: %s computing the mask",
                 c->mask_rc == -E2BIG ? "the grammar's state grew past its bound"
                                      : "out of memory");
        return -1;
    }
    /* A stop token was accepted and the request goes on (ignore_stop): the text is complete,
     * only stop tokens may follow (the matcher allows nothing after its end). */
    if (cst_matcher_ended(c->m))
        for (int k = 0; k < st->n_stops; k++)
            if (st->stops[k] >= 0 && st->stops[k] < st->vocab_n)
                c->mask[st->stops[k] / 32] |= 1u << (st->stops[k] % 32);
    int n = vocab < st->vocab_n ? vocab : st->vocab_n;
    bool any = false;
    for (int w = 0; w * 32 < vocab; w++) {
        int first = w * 32, cnt = vocab - first < 32 ? vocab - first : 32;
        uint32_t word = first < n ? c->mask[w] : 0;
        if (first + cnt > n) word &= first >= n ? 0u : (uint32_t)((1ull << (n - first)) - 1);
        uint32_t full = cnt == 32 ? 0xffffffffu : (uint32_t)((1ull << cnt) - 1);
        if (word == full) {
            any = true;
            continue;
        }
        memcpy(c->saved + first, logits + first, sizeof(float) * (size_t)cnt);
        for (int b = 0; b < cnt; b++)
            if (!(word >> b & 1u)) logits[first + b] = -INFINITY;
        any |= word != 0;
    }
    if (!any) {
        snprintf(c->fail, sizeof c->fail, "constraint: no token is allowed after %u tokens",
                 c->r->n_gen);
        return -1; /* eng_lp_apply calls undo (restore) */
    }
    return 0;
}

static void stage_undo(void *ctx, float *logits, int vocab, int32_t picked)
{
    (void)picked;
    svc_cons *c = ctx;
    cn_state *st = c->st;
    int n = vocab < st->vocab_n ? vocab : st->vocab_n;
    for (int w = 0; w * 32 < vocab; w++) {
        int first = w * 32, cnt = vocab - first < 32 ? vocab - first : 32;
        uint32_t word = first < n ? c->mask[w] : 0;
        if (first + cnt > n) word &= first >= n ? 0u : (uint32_t)((1ull << (n - first)) - 1);
        uint32_t full = cnt == 32 ? 0xffffffffu : (uint32_t)((1ull << cnt) - 1);
        if (word != full) memcpy(logits + first, c->saved + first, sizeof(float) * (size_t)cnt);
    }
}

static const eng_constraint_ops stage_ops = {.mask = stage_mask, .undo = stage_undo};

/* r's matcher (pooled or new) and its stage in r's pipeline. 0 or -ENOMEM. */
static int cons_ready(svc *s, svc_cons *c)
{
    cn_state *st = s->cn;
    cn_entry *e = c->e;
    if (e->n_idle) {
        c->m = e->idle[--e->n_idle];
        st->n_idle--;
    } else if (cst_matcher_create(e->g, st->vocab, &c->m) < 0) {
        c->m = NULL;
        return -ENOMEM;
    }
    svc_req *r = c->r;
    if (!r->lp) {
        eng_logits_params p = {.repetition_penalty = 1.0f};
        if (!(r->lp = eng_lp_create(&p))) return -ENOMEM;
    }
    eng_lp_set_constraint(r->lp, &stage_ops, c);
    r->samp.proc = r->lp;
    return 0;
}

static void waiter_unlink(svc_cons *c)
{
    if (!c->waiting) return;
    if (c->w_prev)
        c->w_prev->w_next = c->w_next;
    else
        c->e->waiters = c->w_next;
    if (c->w_next) c->w_next->w_prev = c->w_prev;
    c->w_prev = c->w_next = NULL;
    c->waiting = false;
}

int cn_attach(svc *s, svc_req *r, const struct ringlm_wire_parsed *rec, sched_reject_reason *rr,
              char *why, size_t len)
{
    cn_state *st = s->cn;
    const struct ringlm_wire_sampling *sm = rec->smp;
    if (!sm || !sm->constraint_kind) return 0;
    *rr = SCHED_REJECT_BAD_PARAMS;
    if (!st || !(st->kinds & (1u << sm->constraint_kind))) {
        snprintf(why, len, "constraint: kind %s is not enforced by this daemon%s",
                 kind_name(sm->constraint_kind),
                 st && st->kinds ? "" : " (it has no tokenizer: start it with --tokenizer)");
        return -ENOTSUP;
    }
    uint64_t h = XXH3_64bits_withSeed(rec->constraint, sm->constraint_bytes, sm->constraint_kind);
    cn_entry *e = st->hash[h % CN_BUCKETS];
    for (; e; e = e->h_next)
        if (e->hash == h && e->kind == sm->constraint_kind && e->n_src == sm->constraint_bytes &&
            (!e->n_src || memcmp(e->src, rec->constraint, e->n_src) == 0))
            break;
    if (e) {
        st->n_hits++;
        lru_unlink(st, e);
        lru_front(st, e);
        if (e->state == CN_FAILED) {
            snprintf(why, len, "constraint: %s", e->err);
            return -EINVAL;
        }
    } else {
        if (st->n_compiling >= CN_MAX_COMPILING) {
            *rr = SCHED_REJECT_QUEUE_FULL;
            snprintf(why, len, "constraint: %u grammars are compiling (limit %u); retry later",
                     st->n_compiling, CN_MAX_COMPILING);
            return -EAGAIN;
        }
        e = calloc(1, sizeof *e);
        if (e && sm->constraint_bytes && !(e->src = malloc(sm->constraint_bytes))) {
            free(e);
            e = NULL;
        }
        if (!e) {
            *rr = SCHED_REJECT_INTERNAL;
            snprintf(why, len, "out of memory");
            return -ENOMEM;
        }
        if (sm->constraint_bytes) memcpy(e->src, rec->constraint, sm->constraint_bytes);
        e->hash = h;
        e->kind = sm->constraint_kind;
        e->n_src = sm->constraint_bytes;
        e->state = CN_COMPILING;
        e->cost = sizeof *e + e->n_src;
        e->h_next = st->hash[h % CN_BUCKETS];
        st->hash[h % CN_BUCKETS] = e;
        lru_front(st, e);
        st->n_entries++;
        st->bytes += e->cost;
        st->n_compiling++;
        pthread_mutex_lock(&st->mu);
        if (st->todo_tail)
            st->todo_tail->q_next = e;
        else
            st->todo_head = e;
        st->todo_tail = e;
        e->q_next = NULL;
        pthread_cond_signal(&st->cv);
        pthread_mutex_unlock(&st->mu);
        evict(st);
    }
    svc_cons *c = calloc(1, sizeof *c);
    if (c) {
        c->mask = calloc(st->words, sizeof(uint32_t));
        c->saved = malloc(sizeof(float) * (size_t)s->mcfg->vocab_size);
    }
    if (!c || !c->mask || !c->saved) {
        if (c) {
            free(c->mask);
            free(c->saved);
            free(c);
        }
        *rr = SCHED_REJECT_INTERNAL;
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    c->st = st;
    c->r = r;
    c->e = e;
    e->refs++;
    r->cons = c;
    if (e->state == CN_COMPILING) {
        c->w_next = e->waiters;
        if (e->waiters) e->waiters->w_prev = c;
        e->waiters = c;
        c->waiting = true;
        return 1;
    }
    if (cons_ready(s, c) < 0) {
        *rr = SCHED_REJECT_INTERNAL;
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

void cn_release(svc *s, svc_req *r)
{
    svc_cons *c = r->cons;
    if (!c) return;
    cn_state *st = s->cn;
    waiter_unlink(c);
    cn_entry *e = c->e;
    if (c->m) {
        if (e->n_idle < CN_POOL_PER_ENTRY && st->n_idle < CN_POOL_TOTAL &&
            (e->idle || (e->idle = calloc(CN_POOL_PER_ENTRY, sizeof *e->idle)))) {
            cst_matcher_reset(c->m);
            e->idle[e->n_idle++] = c->m;
            st->n_idle++;
        } else {
            cst_matcher_free(c->m);
        }
    }
    e->refs--;
    if (r->lp) eng_lp_set_constraint(r->lp, NULL, NULL);
    free(c->mask);
    free(c->saved);
    free(c);
    r->cons = NULL;
    evict(st);
}

/* A compile finished: its waiters go to the scheduler, or are rejected with its error. */
static void compiled(svc *s, cn_entry *e)
{
    cn_state *st = s->cn;
    st->n_compiling--;
    if (e->rc < 0) {
        e->state = CN_FAILED;
        st->n_errors++;
    } else {
        e->state = CN_READY;
        e->g = e->g_new;
        st->n_compiled++;
        size_t extra = cst_grammar_size(e->g) * CN_BYTES_PER_INSN;
        e->cost += extra;
        st->bytes += extra;
    }
    e->g_new = NULL;
    while (e->waiters) {
        svc_cons *c = e->waiters;
        waiter_unlink(c);
        svc_req *r = c->r;
        if (req_state_ended(r->state)) continue; /* cancelled meanwhile */
        char why[RINGLM_WIRE_DETAIL_MAX + 16];
        if (r->sample_idx) {
            /* a further sample of an n > 1 request: its leader, waiting here too, is rejected
             * or submitted for the group (and a rejected leader ends it); out of memory for
             * its own matcher ends it alone, with an error */
            if (e->state == CN_READY && cons_ready(s, c) < 0) {
                if (!r->detail) r->detail = strdup("constraint: out of memory");
                req_end(s, r, RINGLM_WIRE_R_ERROR, RINGLM_WIRE_R_INTERNAL);
            }
        } else if (e->state == CN_FAILED) {
            snprintf(why, sizeof why, "constraint: %s", e->err);
            adm_reject(s, r, SCHED_REJECT_BAD_PARAMS, why);
        } else if (cons_ready(s, c) < 0) {
            adm_reject(s, r, SCHED_REJECT_INTERNAL, "out of memory");
        } else {
            adm_submit(s, r);
        }
    }
    evict(st);
}

bool cn_tick(svc *s)
{
    cn_state *st = s->cn;
    if (!st || st->efd_armed || !st->compile_started) return false;
    arm_efd(s);
    return !st->efd_armed && st->n_compiling;
}

bool cn_on_cqe(svc *s, const struct io_uring_cqe *cqe)
{
    cn_state *st = s->cn;
    if (!st || io_uring_cqe_get_data64(cqe) != SVC_CONSTRAIN_TAG) return false;
    st->efd_armed = false;
    pthread_mutex_lock(&st->mu);
    cn_entry *done = st->done_head;
    st->done_head = NULL;
    pthread_mutex_unlock(&st->mu);
    /* oldest first (the list is newest first) */
    cn_entry *rev = NULL;
    while (done) {
        cn_entry *n = done->q_next;
        done->q_next = rev;
        rev = done;
        done = n;
    }
    while (rev) {
        cn_entry *n = rev->q_next;
        rev->q_next = NULL;
        compiled(s, rev);
        rev = n;
    }
    arm_efd(s);
    return true;
}

/* ---- a step's masks ---------------------------------------------------------------------- */

void cn_batch_reset(svc *s)
{
    if (s->cn) s->cn->n_batch = 0;
}

void cn_batch_add(svc *s, svc_req *r)
{
    cn_state *st = s->cn;
    svc_cons *c = r->cons;
    if (!st || !c || !c->m) return;
    c->masked = false;
    if (st->n_batch == st->cap_batch) {
        int cap = st->cap_batch ? st->cap_batch * 2 : 64;
        svc_cons **b = realloc(st->batch, sizeof *b * (size_t)cap);
        if (!b) return; /* computed at its first use instead */
        st->batch = b;
        st->cap_batch = cap;
    }
    st->batch[st->n_batch++] = c;
}

void cn_batch_start(svc *s)
{
    cn_state *st = s->cn;
    if (!st || !st->n_batch || !st->mask_started) return;
    pthread_mutex_lock(&st->mmu);
    st->gen++;
    st->pending = true;
    pthread_cond_signal(&st->mcv);
    pthread_mutex_unlock(&st->mmu);
}

void cn_batch_join(svc *s)
{
    if (s->cn) cn_join(s->cn);
}

int cn_accept(svc *s, svc_req *r, int32_t tok, char *why, size_t len)
{
    (void)s;
    svc_cons *c = r->cons;
    if (!c || !c->m) return 0;
    c->masked = false;
    if (cst_matcher_ended(c->m)) return 0; /* a stop token again, after the end (ignore_stop) */
    int rc = cst_matcher_accept(c->m, tok);
    if (rc == -EINVAL)
        snprintf(why, len, "constraint: token %d is not allowed after %u tokens", tok, r->n_gen);
    else if (rc < 0)
        snprintf(why, len, "constraint: out of memory advancing the matcher");
    return rc;
}

const char *cn_row_failure(svc *s, svc_req *r)
{
    (void)s;
    return r->cons && r->cons->fail[0] ? r->cons->fail : "constraint: the mask failed";
}

void cn_count_row_failure(svc *s)
{
    if (s->cn) s->cn->n_row_failures++;
}

void cn_figures(const svc *s, cn_figures_t *out)
{
    memset(out, 0, sizeof *out);
    const cn_state *st = s->cn;
    if (!st) return;
    out->kinds = st->kinds;
    out->entries = st->n_entries;
    out->bytes = st->bytes;
    out->compiling = st->n_compiling;
    out->hits = st->n_hits;
    out->compiled = st->n_compiled;
    out->errors = st->n_errors;
    out->row_failures = st->n_row_failures;
    out->mask_rows = st->mask_rows;
    out->mask_us = st->mask_ns / 1000;
    out->wait_us = st->wait_ns / 1000;
}

void cn_free(svc *s)
{
    cn_state *st = s->cn;
    if (!st) return;
    cn_stop(s);
    while (st->lru_head) {
        cn_entry *e = st->lru_head;
        /* an entry still queued or compiling: the thread has stopped, nothing holds it */
        cst_grammar_free(e->g_new);
        e->g_new = NULL;
        entry_drop(st, e);
    }
    if (st->efd >= 0) close(st->efd);
    cst_vocab_free(st->vocab);
    free(st->batch);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mmu);
    pthread_cond_destroy(&st->mcv);
    pthread_cond_destroy(&st->mdone);
    free(st);
    s->cn = NULL;
}
