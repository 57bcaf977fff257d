/* SPDX-License-Identifier: MIT */
/*
 * tests/test_daemon_sampling.c — the sampling extensions (ringlm_sampling: logit bias,
 * repetition / presence / frequency penalties, min-p, stop token ids) through a real ringlmd:
 * each processor changes the greedy answer exactly as a small reference computation over the
 * engine's logits says; a -100 bias never emits its token; stop ids end the request; neutral
 * values give today's answer; bad values are refused at submit (-EINVAL with a detail) and,
 * written to the ring past the library, by the daemon (bad_params); what is not implemented
 * yet is refused (-ENOTSUP), never accepted silently.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/futex.h"
#include "kernels/batch.h"
#include "kernels/engine.h"
#include "libclient/ringlm.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/engine_test_util.h"
#include "tests/helpers.h"

/* The shape of stories260K (context 512, vocabulary 512); the real file when it is there. */
#define SYNTH "synthetic:stories260K:1"
#define VOCAB 512

static void start(th_daemon *d, const char *model)
{
    const char *args[] = {"--model", model, NULL};
    th_daemon_init(d);
    th_daemon_start(d, args, 20000);
}

static void stop(th_daemon *d)
{
    cr_expect_eq(th_daemon_stop(d, SIGTERM, 10000), 0, "%s", th_daemon_output(d));
    th_daemon_cleanup(d);
}

/* Submits one request with smp and collects its tokens until its FINISH. */
static ringlm_event run_one(ringlm_client *c, const ringlm_request *r, const ringlm_sampling *smp,
                            int32_t *out, uint32_t max_out, uint32_t *n_out)
{
    uint64_t id;
    cr_assert_eq(ringlm_submit_ext(c, r, smp, &id), 0, "submit: %s", ringlm_errdetail());
    *n_out = 0;
    for (;;) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, 30000);
        cr_assert_gt(rc, 0, "next_event %d: %s", rc, ringlm_errdetail());
        if (ev.req_id != id) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            cr_assert_eq(ev.index, *n_out);
            if (*n_out < max_out) out[*n_out] = ev.token;
            (*n_out)++;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            return ev;
        }
    }
}

/* ---- bad input ------------------------------------------------------------------------ */

typedef struct smp_case {
    const char *field;
    int err; /* -EINVAL out of range, -ENOTSUP not implemented */
    void (*set)(ringlm_sampling *s);
} smp_case;

static const ringlm_logit_bias bias_oov[] = {{3, 1.0f}, {VOCAB, -5.0f}};
static const ringlm_logit_bias bias_101[] = {{3, 101.0f}};
static const ringlm_logit_bias bias_nan[] = {{3, NAN}};
static const ringlm_logit_bias bias_neg[] = {{-1, 1.0f}};
static const ringlm_logit_bias bias_dup[] = {{7, 1.0f}, {9, 1.0f}, {7, 2.0f}};
static const int32_t stop_oov[] = {2, VOCAB + 3};

static void s_bias_oov(ringlm_sampling *s)
{
    s->logit_bias = bias_oov;
    s->n_logit_bias = 2;
}
static void s_bias_101(ringlm_sampling *s)
{
    s->logit_bias = bias_101;
    s->n_logit_bias = 1;
}
static void s_bias_nan(ringlm_sampling *s)
{
    s->logit_bias = bias_nan;
    s->n_logit_bias = 1;
}
static void s_bias_neg(ringlm_sampling *s)
{
    s->logit_bias = bias_neg;
    s->n_logit_bias = 1;
}
static void s_bias_dup(ringlm_sampling *s)
{
    s->logit_bias = bias_dup;
    s->n_logit_bias = 3;
}
static void s_bias_many(ringlm_sampling *s)
{
    s->logit_bias = bias_101; /* the count is refused before the list is read */
    s->n_logit_bias = RINGLM_MAX_LOGIT_BIAS + 1;
}
static void s_bias_null(ringlm_sampling *s)
{
    s->n_logit_bias = 1;
}
static void s_rep_nan(ringlm_sampling *s)
{
    s->repetition_penalty = NAN;
}
static void s_rep_zero(ringlm_sampling *s)
{
    s->repetition_penalty = 0.0f;
}
static void s_pres(ringlm_sampling *s)
{
    s->presence_penalty = 2.5f;
}
static void s_freq_nan(ringlm_sampling *s)
{
    s->frequency_penalty = NAN;
}
static void s_min_p(ringlm_sampling *s)
{
    s->min_p = 1.5f;
}
static void s_stop_oov(ringlm_sampling *s)
{
    s->stop_token_ids = stop_oov;
    s->n_stop_token_ids = 2;
}
static void s_stop_many(ringlm_sampling *s)
{
    s->stop_token_ids = stop_oov;
    s->n_stop_token_ids = RINGLM_MAX_STOP_TOKEN_IDS + 1;
}
static void s_top_lp(ringlm_sampling *s)
{
    s->flags = RINGLM_SAMPLING_LOGPROBS;
    s->top_logprobs = 21;
}
static void s_top_lp_noflag(ringlm_sampling *s)
{
    s->top_logprobs = 3;
}
static void s_flags(ringlm_sampling *s)
{
    s->flags = 0x100;
}
static void s_size(ringlm_sampling *s)
{
    s->size = 8;
}
static void s_processed_alone(ringlm_sampling *s)
{
    s->flags = RINGLM_SAMPLING_LOGPROBS_PROCESSED; /* "processed" of no log-probabilities */
}
static void s_prompt_lp_noflag(ringlm_sampling *s)
{
    s->prompt_logprobs = 2;
}
static void s_n(ringlm_sampling *s)
{
    s->n = RINGLM_WIRE_MAX_N + 1;
}
static void s_constraint(ringlm_sampling *s)
{
    s->constraint_kind = 9; /* no such kind (the kinds a daemon enforces: test_daemon_constrain) */
    s->constraint = "[a-z]+";
    s->constraint_bytes = 6;
}

static const smp_case bad_smp[] = {
    {"logit_bias", -EINVAL, s_bias_oov},
    {"logit_bias", -EINVAL, s_bias_101},
    {"logit_bias", -EINVAL, s_bias_nan},
    {"logit_bias", -EINVAL, s_bias_neg},
    {"logit_bias", -EINVAL, s_bias_dup},
    {"logit_bias", -EINVAL, s_bias_many},
    {"logit_bias", -EINVAL, s_bias_null},
    {"repetition_penalty", -EINVAL, s_rep_nan},
    {"repetition_penalty", -EINVAL, s_rep_zero},
    {"presence_penalty", -EINVAL, s_pres},
    {"frequency_penalty", -EINVAL, s_freq_nan},
    {"min_p", -EINVAL, s_min_p},
    {"stop_token_ids", -EINVAL, s_stop_oov},
    {"stop_token_ids", -EINVAL, s_stop_many},
    {"top_logprobs", -EINVAL, s_top_lp},
    {"top_logprobs", -EINVAL, s_top_lp_noflag},
    {"flags", -EINVAL, s_flags},
    {"size", -EINVAL, s_size},
    {"flags", -EINVAL, s_processed_alone},
    {"prompt_logprobs", -EINVAL, s_prompt_lp_noflag},
    {"n", -EINVAL, s_n},
    {"constraint", -EINVAL, s_constraint},
};
#define N_BAD_SMP (sizeof bad_smp / sizeof bad_smp[0])

/* ringlm_submit_ext refuses each at once, the detail and *field naming the member; what is
 * not implemented is -ENOTSUP. The daemon says its vocabulary at the handshake, so ids are
 * checked at submit; without a vocabulary (ringlm_request_check_ext(.., 0, ..)) an id past
 * it is left to the daemon. The ranges' edges are served. */
Test(daemon_sampling, bad_values_are_refused_at_submit)
{
    const int32_t prompt[3] = {1, 403, 407};
    th_daemon d;
    start(&d, SYNTH);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    cr_expect_eq(ringlm_vocab_size(c), VOCAB);
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 3;
    r.max_new_tokens = 4;
    for (size_t i = 0; i < N_BAD_SMP; i++) {
        ringlm_sampling s;
        ringlm_sampling_init(&s);
        bad_smp[i].set(&s);
        const char *field = NULL;
        cr_expect_eq(ringlm_request_check_ext(&r, &s, VOCAB, &field), bad_smp[i].err,
                     "case %zu (%s): %s", i, bad_smp[i].field, ringlm_errdetail());
        cr_expect_str_eq(field ? field : "(null)", bad_smp[i].field, "case %zu", i);
        uint64_t id = 0;
        cr_expect_eq(ringlm_submit_ext(c, &r, &s, &id), bad_smp[i].err, "case %zu (%s) was sent", i,
                     bad_smp[i].field);
        const char *det = ringlm_errdetail();
        cr_expect(!strncmp(det, bad_smp[i].field, strlen(bad_smp[i].field)),
                  "case %zu: detail '%s' does not start with %s", i, det, bad_smp[i].field);
    }
    /* Without the vocabulary the id is not judged here (the daemon does). */
    ringlm_sampling s;
    ringlm_sampling_init(&s);
    s_bias_oov(&s);
    cr_expect_eq(ringlm_request_check_ext(&r, &s, 0, NULL), 0, "%s", ringlm_errdetail());

    /* A newer header's larger struct: fine while the unknown tail is zero. */
    struct {
        ringlm_sampling s;
        uint64_t more;
    } big;
    memset(&big, 0, sizeof big);
    ringlm_sampling_init(&big.s);
    big.s.size = sizeof big;
    cr_expect_eq(ringlm_request_check_ext(&r, &big.s, VOCAB, NULL), 0, "%s", ringlm_errdetail());
    big.more = 1;
    const char *field = NULL;
    cr_expect_eq(ringlm_request_check_ext(&r, &big.s, VOCAB, &field), -ENOTSUP);
    cr_expect_str_eq(field ? field : "(null)", "size");

    /* The edges are inside, and served. */
    static const ringlm_logit_bias edges[] = {{0, -100.0f}, {VOCAB - 1, 100.0f}};
    static const int32_t stops[] = {VOCAB - 1};
    ringlm_sampling_init(&s);
    s.logit_bias = edges;
    s.n_logit_bias = 2;
    s.repetition_penalty = 100.0f;
    s.presence_penalty = -2.0f;
    s.frequency_penalty = 2.0f;
    s.min_p = 1.0f;
    s.stop_token_ids = stops;
    s.n_stop_token_ids = 1;
    cr_expect_eq(ringlm_request_check_ext(&r, &s, VOCAB, NULL), 0, "%s", ringlm_errdetail());
    int32_t out[8];
    uint32_t n = 0;
    ringlm_event ev = run_one(c, &r, &s, out, 8, &n);
    /* +100 on the stop id: it is sampled first, and it ends the request unemitted. */
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_STOP, "finish %s",
                 ringlm_reason_name(ev.finish_reason));
    cr_expect_eq(n, 0);
    ringlm_close(c);
    stop(&d);
}

/* ---- the daemon's own check: a client that writes REQUEST_EXT records itself ----------- */

static void raw_put_ext(th_raw *r, uint64_t id, const struct ringlm_wire_sampling *sm,
                        const struct ringlm_wire_bias *bias, const int32_t *stops)
{
    static const int32_t p[3] = {1, 403, 407};
    uint64_t cap = r->cseg->hdr.data_bytes;
    uint8_t *data = (uint8_t *)r->cseg + r->cseg->hdr.data_off;
    uint8_t rec[512];
    uint32_t len = (uint32_t)ringlm_wire_request_ext_bytes(3, sm->n_logit_bias, sm->n_stop_ids, 0);
    cr_assert_leq(len, sizeof rec);
    memset(rec, 0, sizeof rec);
    struct ringlm_wire_rec_hdr h = {.len = len, .type = RINGLM_WIRE_REC_REQUEST_EXT};
    struct ringlm_wire_request q = {
        .req_id = id, .max_new_tokens = 4, .n_prompt = 3, .temperature = 0, .top_p = 1};
    strcpy(q.class_name, "default");
    size_t off = 0;
    memcpy(rec + off, &h, sizeof h);
    off += sizeof h;
    memcpy(rec + off, &q, sizeof q);
    off += sizeof q;
    memcpy(rec + off, sm, sizeof *sm);
    off += sizeof *sm;
    memcpy(rec + off, p, sizeof p);
    off += sizeof p;
    memcpy(rec + off, bias, sizeof *bias * sm->n_logit_bias);
    off += sizeof *bias * sm->n_logit_bias;
    memcpy(rec + off, stops, sizeof *stops * sm->n_stop_ids);
    for (uint32_t k = 0; k < len; k++) data[(r->at + k) & (cap - 1)] = rec[k];
    r->at += len;
}

static void raw_publish(th_raw *r)
{
    __atomic_store_n(&r->cseg->submit_prod, r->at, __ATOMIC_RELEASE);
    __atomic_add_fetch(&r->cseg->doorbell, 1, __ATOMIC_SEQ_CST);
    futex_wake(&r->cseg->doorbell, 1, FUTEX_SCOPE_SHARED);
}

Test(daemon_sampling, bad_values_on_the_wire_are_bad_params_from_the_daemon)
{
    th_daemon d;
    start(&d, SYNTH);
    th_raw r;
    th_raw_connect(d.sock, &r);
    cr_expect(r.dseg->caps & RINGLM_WIRE_CAP_SAMPLING, "caps 0x%x", r.dseg->caps);
    cr_expect_eq(r.dseg->vocab_size, VOCAB);
    const struct ringlm_wire_sampling neutral = {.repetition_penalty = 1.0f};
    struct ringlm_wire_sampling sm[6];
    struct ringlm_wire_bias bias[6][2];
    int32_t stops[6][1];
    for (int i = 0; i < 6; i++) {
        sm[i] = neutral;
        bias[i][0] = (struct ringlm_wire_bias){5, 1.0f};
        stops[i][0] = 2;
    }
    sm[0].n_logit_bias = 1; /* 1: a bias id past the vocabulary */
    bias[0][0].token = VOCAB + 7;
    sm[1].n_logit_bias = 1; /* 2: a NaN bias */
    bias[1][0].bias = NAN;
    sm[2].repetition_penalty = NAN;  /* 3 */
    sm[3].n = RINGLM_WIRE_MAX_N + 1; /* 4: n past the wire's bound */
    sm[4].n_stop_ids = 1;            /* 5: a stop id past the vocabulary */
    stops[4][0] = VOCAB;
    sm[5].n_logit_bias = 1; /* 6: good, served */
    sm[5].n_stop_ids = 1;
    for (int i = 0; i < 6; i++) raw_put_ext(&r, (uint64_t)i + 1, &sm[i], bias[i], stops[i]);
    raw_publish(&r);
    const struct ringlm_wire_event *slots =
        (const struct ringlm_wire_event *)((const uint8_t *)r.dseg + r.dseg->hdr.data_off);
    uint64_t n_slots = r.dseg->hdr.data_bytes / sizeof(struct ringlm_wire_event);
    int finished = 0;
    uint64_t cons = 0, deadline = th_now_ms() + 20000;
    while (finished < 6) {
        uint64_t prod = __atomic_load_n(&r.dseg->ev_prod, __ATOMIC_ACQUIRE);
        if (cons == prod) {
            cr_assert_lt(th_now_ms(), deadline, "%d of 6 records answered", finished);
            th_pause_ms(2);
            continue;
        }
        struct ringlm_wire_event ev = slots[cons++ & (n_slots - 1)];
        __atomic_store_n(&r.cseg->ev_cons, cons, __ATOMIC_RELEASE);
        uint32_t kind = RINGLM_WIRE_EV_KIND(ev.meta);
        if (kind != RINGLM_WIRE_EV_FINISH) {
            cr_expect(kind == RINGLM_WIRE_EV_FINISH_EXT || ev.req_id == 6,
                      "request %llu got a token", (unsigned long long)ev.req_id);
            continue;
        }
        uint32_t low = RINGLM_WIRE_EV_LOW(ev.meta);
        if (ev.req_id == 6) {
            cr_expect_neq(low >> 8, RINGLM_WIRE_R_REJECTED, "the good record was %s/%s",
                          ringlm_wire_reason_name(low >> 8), ringlm_wire_reason_name(low & 0xff));
        } else {
            cr_expect_eq(low >> 8, RINGLM_WIRE_R_REJECTED, "record %llu",
                         (unsigned long long)ev.req_id);
            cr_expect_eq(low & 0xff, RINGLM_WIRE_R_BAD_PARAMS, "record %llu: cause %s",
                         (unsigned long long)ev.req_id, ringlm_wire_reason_name(low & 0xff));
        }
        finished++;
    }
    th_raw_close(&r);
    /* The daemon lives and serves a good client. */
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    const int32_t prompt[3] = {1, 403, 407};
    ringlm_request q;
    ringlm_request_init(&q);
    q.prompt = prompt;
    q.n_prompt = 3;
    q.max_new_tokens = 4;
    int32_t out[8];
    uint32_t n;
    ringlm_event ev = run_one(c, &q, NULL, out, 8, &n);
    cr_expect_eq(ev.finish_reason, RINGLM_FINISH_LENGTH);
    ringlm_close(c);
    stop(&d);
}

/* ---- the processors against a reference over the engine's logits ------------------------ */

typedef struct proc_case {
    const char *name;
    const ringlm_logit_bias *bias;
    uint32_t n_bias;
    float rep, pres, freq;
} proc_case;

/* The pipeline's stages 1–3 as the documentation defines them, written plainly. */
static void ref_process(float *l, const proc_case *pc, const int32_t *seq, int n_prompt, int n)
{
    for (uint32_t i = 0; i < pc->n_bias; i++) l[pc->bias[i].token] += pc->bias[i].bias;
    static bool seen[VOCAB];
    static uint32_t count[VOCAB];
    memset(seen, 0, sizeof seen);
    memset(count, 0, sizeof count);
    for (int i = 0; i < n; i++) seen[seq[i]] = true;
    for (int i = n_prompt; i < n; i++) count[seq[i]]++;
    for (int t = 0; t < VOCAB; t++) {
        if (!seen[t]) continue;
        if (pc->rep != 1.0f) l[t] = l[t] > 0.0f ? l[t] / pc->rep : l[t] * pc->rep;
        if (count[t]) {
            l[t] -= (float)count[t] * pc->freq;
            l[t] -= pc->pres;
        }
    }
}

/* Greedy decode through the engine with the reference processors: up to max_new tokens,
 * stopping on BOS (1) as the daemon does for a llama2.c model. *exact: how many leading
 * tokens the reference is sure of (the gap between its two best processed logits stayed
 * above 1e-3, so a last-bit difference between a batched and a lone step cannot flip it). */
static int ref_generate(eng *e, const eng_model_config *cfg, const int32_t *prompt, int n_prompt,
                        const proc_case *pc, int max_new, int32_t *out, int *exact)
{
    tseq s;
    ts_seq_init(&s, prompt, n_prompt, 0);
    tseq *one[1] = {&s};
    float *lg = malloc(sizeof(float) * (size_t)cfg->vocab_size);
    int rows = n_prompt, n = 0;
    *exact = -1;
    cr_assert_eq(ts_step(e, cfg, one, &rows, 1, lg), 0, "%s", eng_errmsg());
    for (;;) {
        ref_process(lg, pc, s.tokens, n_prompt, s.n_tokens);
        int32_t best = ts_argmax(lg, cfg->vocab_size);
        float second = -INFINITY;
        for (int t = 0; t < cfg->vocab_size; t++)
            if (t != best && lg[t] > second) second = lg[t];
        if (*exact < 0 && lg[best] - second < 1e-3f) *exact = n;
        if (best == 1 || n == max_new) break;
        out[n++] = best;
        s.tokens[s.n_tokens++] = best;
        rows = 1;
        cr_assert_eq(ts_step(e, cfg, one, &rows, 1, lg), 0, "%s", eng_errmsg());
    }
    if (*exact < 0) *exact = n;
    free(lg);
    return n;
}

Test(daemon_sampling, each_processor_changes_greedy_as_the_reference_says, .timeout = 240)
{
    char model[512];
    if (!stories_path(model, sizeof model)) cr_skip_test("no stories260K.bin under RINGLM_SHARED");
    ref_case refs[12];
    int n_refs = load_refs(refs, 12);
    cr_assert_geq(n_refs, 2);
    eng_model *m;
    cr_assert_eq(eng_model_load(model, &m), 0, "%s", eng_errmsg());
    const eng_model_config *cfg = eng_model_cfg(m);
    cr_assert_eq(cfg->vocab_size, VOCAB);
    eng *e = ts_engine(m, 64, 16, 1);

    /* The plain greedy answer of the first case: forbid its commonest tokens, favour one. */
    const ref_case *rc = &refs[0];
    int hist[VOCAB] = {0};
    for (uint32_t i = 0; i < rc->n_gen && i < 64; i++) hist[rc->gen[i]]++;
    int32_t top1 = 0, top2 = 0;
    for (int t = 0; t < VOCAB; t++)
        if (hist[t] > hist[top1]) top1 = t;
    for (int t = 0; t < VOCAB; t++)
        if (t != top1 && hist[t] > hist[top2]) top2 = t;
    const ringlm_logit_bias forbid[] = {{top1, -100.0f}, {top2, -100.0f}};
    int32_t absent = 300; /* a word piece the plain answer never uses */
    while (hist[absent]) absent++;
    const ringlm_logit_bias favour[] = {{absent, 6.0f}};
    const proc_case cases[] = {
        {"bias -100", forbid, 2, 1.0f, 0.0f, 0.0f},
        {"bias +6", favour, 1, 1.0f, 0.0f, 0.0f},
        {"repetition 1.3", NULL, 0, 1.3f, 0.0f, 0.0f},
        {"repetition 0.8", NULL, 0, 0.8f, 0.0f, 0.0f},
        {"presence 1.5", NULL, 0, 1.0f, 1.5f, 0.0f},
        {"frequency 0.7", NULL, 0, 1.0f, 0.0f, 0.7f},
        {"all", forbid, 2, 1.2f, 0.4f, 0.3f},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);

    th_daemon d;
    start(&d, model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    enum { MAX_NEW = 64 };
    for (int k = 0; k < 2; k++) {
        const ref_case *pr = &refs[k];
        for (int ci = 0; ci < n_cases; ci++) {
            const proc_case *pc = &cases[ci];
            int32_t want[MAX_NEW + 1], got[MAX_NEW + 1];
            int exact;
            int n_want =
                ref_generate(e, cfg, pr->prompt, (int)pr->n_prompt, pc, MAX_NEW, want, &exact);
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = pr->prompt;
            r.n_prompt = pr->n_prompt;
            r.max_new_tokens = MAX_NEW;
            ringlm_sampling s;
            ringlm_sampling_init(&s);
            s.logit_bias = pc->bias;
            s.n_logit_bias = pc->n_bias;
            s.repetition_penalty = pc->rep;
            s.presence_penalty = pc->pres;
            s.frequency_penalty = pc->freq;
            uint32_t n_got;
            ringlm_event ev = run_one(c, &r, &s, got, MAX_NEW, &n_got);
            cr_expect_neq(ev.finish_reason, RINGLM_FINISH_REJECTED, "%s: rejected %s", pc->name,
                          ringlm_reason_name(ev.reject_reason));
            /* The reference is sure of most of the answer, else this test proves little. */
            cr_expect_geq(exact, 24, "case %d %s: the reference is ambiguous after %d tokens", k,
                          pc->name, exact);
            int cmp = exact < n_want ? exact : n_want;
            for (int i = 0; i < cmp; i++)
                cr_expect_eq(got[i], want[i], "case %d %s: token %d is %d, the reference says %d",
                             k, pc->name, i, got[i], want[i]);
            if (exact >= n_want)
                cr_expect_eq((int)n_got, n_want, "case %d %s: %u tokens, the reference %d", k,
                             pc->name, n_got, n_want);
            /* The processor did something: the answer is not the plain greedy one. */
            bool differs = false;
            for (int i = 0; i < cmp && i < (int)pr->n_gen; i++) differs |= want[i] != pr->gen[i];
            cr_expect(differs, "case %d %s: the reference equals plain greedy", k, pc->name);
            /* A -100 bias never emits its token. */
            for (uint32_t b = 0; b < pc->n_bias; b++)
                if (pc->bias[b].bias <= -100.0f)
                    for (uint32_t i = 0; i < n_got && i < MAX_NEW; i++)
                        cr_expect_neq(got[i], pc->bias[b].token,
                                      "case %d %s: forbidden token %d at %u", k, pc->name,
                                      pc->bias[b].token, i);
        }
    }
    ringlm_close(c);
    stop(&d);
    eng_destroy(e);
    eng_model_free(m);
}

/* Neutral values (and min_p, top_k, top_p, which never change a greedy pick) give exactly the
 * recorded greedy answer; min_p 1 at temperature 1 keeps only the most likely token, so it is
 * greedy too, where temperature 1 alone is not. */
Test(daemon_sampling, neutral_values_and_min_p_one_give_the_greedy_answer, .timeout = 240)
{
    char model[512];
    if (!stories_path(model, sizeof model)) cr_skip_test("no stories260K.bin under RINGLM_SHARED");
    ref_case refs[12];
    int n_refs = load_refs(refs, 12);
    cr_assert_geq(n_refs, 3);
    th_daemon d;
    start(&d, model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    for (int k = 0; k < 3; k++) {
        const ref_case *pr = &refs[k];
        uint32_t max_new = pr->max_new < 80 ? pr->max_new : 80;
        for (int mode = 0; mode < 3; mode++) {
            ringlm_request r;
            ringlm_request_init(&r);
            r.prompt = pr->prompt;
            r.n_prompt = pr->n_prompt;
            r.max_new_tokens = max_new;
            ringlm_sampling s;
            ringlm_sampling_init(&s);
            if (mode == 1) s.min_p = 0.5f; /* greedy: no effect */
            if (mode >= 1) r.seed = 11;
            if (mode == 2) {
                r.temperature = 1.0f;
                s.min_p = 1.0f;
            }
            int32_t got[600];
            uint32_t n;
            ringlm_event ev = run_one(c, &r, &s, got, 600, &n);
            cr_expect_neq(ev.finish_reason, RINGLM_FINISH_REJECTED);
            uint32_t want_n = pr->n_gen < max_new ? pr->n_gen : max_new;
            cr_expect_eq(n, want_n, "case %d mode %d: %u tokens, the reference %u", k, mode, n,
                         want_n);
            for (uint32_t i = 0; i < n && i < want_n; i++)
                cr_expect_eq(got[i], pr->gen[i], "case %d mode %d: token %u is %d, greedy %d", k,
                             mode, i, got[i], pr->gen[i]);
        }
        /* temperature 1 without min_p: not the greedy answer (the test above can fail). */
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = pr->prompt;
        r.n_prompt = pr->n_prompt;
        r.max_new_tokens = max_new;
        r.temperature = 1.0f;
        r.seed = 11;
        int32_t got[600];
        uint32_t n;
        run_one(c, &r, NULL, got, 600, &n);
        bool differs = n != (pr->n_gen < max_new ? pr->n_gen : max_new);
        for (uint32_t i = 0; !differs && i < n; i++) differs = got[i] != pr->gen[i];
        cr_expect(differs, "case %d: temperature 1 gave the greedy answer", k);
    }
    ringlm_close(c);
    stop(&d);
}

/* A stop id ends the request with "stop", unemitted, at its first occurrence in the greedy
 * answer; ignore_stop (the model's stop token) does not override it. */
Test(daemon_sampling, stop_token_ids_end_the_request)
{
    char model[512];
    if (!stories_path(model, sizeof model)) cr_skip_test("no stories260K.bin under RINGLM_SHARED");
    ref_case refs[12];
    cr_assert_geq(load_refs(refs, 12), 1);
    const ref_case *pr = &refs[0];
    cr_assert_geq(pr->n_gen, 20);
    int32_t stop_id = pr->gen[12];
    uint32_t first = 0;
    while (pr->gen[first] != stop_id) first++;
    th_daemon d;
    start(&d, model);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0, "connect: %s", ringlm_errdetail());
    for (int ignore = 0; ignore < 2; ignore++) {
        ringlm_request r;
        ringlm_request_init(&r);
        r.prompt = pr->prompt;
        r.n_prompt = pr->n_prompt;
        r.max_new_tokens = 40;
        r.ignore_stop = ignore;
        const int32_t stops[] = {VOCAB - 2, stop_id};
        ringlm_sampling s;
        ringlm_sampling_init(&s);
        s.stop_token_ids = stops;
        s.n_stop_token_ids = 2;
        int32_t got[64];
        uint32_t n;
        ringlm_event ev = run_one(c, &r, &s, got, 64, &n);
        cr_expect_eq(ev.finish_reason, RINGLM_FINISH_STOP, "ignore_stop %d: finish %s", ignore,
                     ringlm_reason_name(ev.finish_reason));
        cr_expect_eq(n, first, "ignore_stop %d: %u tokens, the stop id first comes at %u", ignore,
                     n, first);
        cr_expect_eq(ev.n_tokens, first);
        for (uint32_t i = 0; i < n; i++) cr_expect_eq(got[i], pr->gen[i]);
    }
    ringlm_close(c);
    stop(&d);
}
