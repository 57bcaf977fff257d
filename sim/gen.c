/* ringlm — simulator workload generators and the five scenarios. SPDX-License-Identifier: MIT */
#include "sim/gen.h"
#include "sim/err.h"
#include "sim/rng.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters ------------------------------------------------------------------------- */

typedef struct param_def {
    const char *key, *def, *help;
} param_def;

#define COMMON_PARAMS                                                                              \
    {"prompt", "128-512", "prompt tokens: N, LO-HI (uniform) or exp:MEAN"},                        \
        {"output", "64-256", "output tokens: N, LO-HI or exp:MEAN"},                               \
    {                                                                                              \
        "lengths", "", "draw (prompt, output) pairs from this trace file instead"                  \
    }

static const param_def p_open[] = {
    {"rate", "", "arrivals per second (default: load x estimated capacity)"},
    {"load", "0.7", "offered load as a multiple of the estimated capacity"},
    {"cv", "1", "coefficient of variation of inter-arrival gaps (gamma)"},
    {"duration", "60", "seconds of arrivals"},
    {"n", "", "number of requests (instead of duration)"},
    {"tenants", "", "tenant rule, as --tenants"},
    {"classes", "", "class rule, as --classes"},
    {"deadline_ms", "", "every request carries a deadline this long after its arrival"},
    {"arrivals_from", "",
     "take rate and CV of the gaps from this trace file (gamma; poisson: rate)"},
    {"samples", "1", "samples of each prompt (ringlm's n: one prefill, shared blocks)"},
    {"logprobs", "0", "1: every request asks for log-probabilities (their cost per row)"},
    {"processors", "0", "1: every request has logit bias and penalties (their cost per row)"},
    COMMON_PARAMS,
    {NULL, NULL, NULL}};
static const param_def p_long[] = {
    {"load", "0.5", "short chats' load as a multiple of capacity"},
    {"duration", "30", "seconds of arrivals"},
    {"long", "16000", "tokens of the very long prompt"},
    {"long_output", "16", "output tokens of the long request"},
    {"long_at", "5", "when the long prompt arrives (s)"},
    {"ttft_limit_ms", "250", "verdict: short chats' TTFT p99 must stay under this"},
    {"stall_limit_ms", "150", "verdict: short chats' longest inter-token gap under this"},
    COMMON_PARAMS,
    {NULL, NULL, NULL}};
static const param_def p_two[] = {
    {"load", "2", "total offered load as a multiple of capacity"},
    {"ratio", "10", "loud tenant's arrival rate / quiet tenant's"},
    {"duration", "60", "seconds of arrivals"},
    {"share_min", "0.9", "verdict: quiet tenant keeps this fraction of its fair share"},
    COMMON_PARAMS,
    {NULL, NULL, NULL}};
static const param_def p_disc[] = {
    {"load", "0.6", "offered load as a multiple of capacity"},
    {"duration", "30", "seconds of arrivals"},
    {"cancel_frac", "0.5", "fraction of clients that disconnect"},
    {"cancel_after", "0.5-3", "seconds after arrival they disconnect (LO-HI)"},
    {"prompt", "128-512", "prompt tokens"},
    {"output", "256-1024", "output tokens"},
    {"lengths", "", "draw (prompt, output) pairs from this trace file instead"},
    {NULL, NULL, NULL}};
static const param_def p_burst[] = {
    {"load", "0.5", "base load as a multiple of capacity"},
    {"burst_load", "2", "load during the burst"},
    {"burst_at", "30", "burst start (s)"},
    {"burst_s", "10", "burst length (s)"},
    {"duration", "90", "seconds of arrivals"},
    {"recover_limit_s", "30", "verdict: queue wait back at baseline within this after the burst"},
    COMMON_PARAMS,
    {NULL, NULL, NULL}};
static const param_def p_over[] = {
    {"load", "2", "sustained offered load as a multiple of capacity"},
    {"duration", "60", "seconds of arrivals"},
    {"slo_min", "0.9", "verdict: accepted requests meet their targets this often"},
    COMMON_PARAMS,
    {NULL, NULL, NULL}};

static const param_def p_shared[] = {
    {"rate", "", "requests per second (default: load x estimated capacity)"},
    {"load", "0.7", "offered load as a multiple of the estimated capacity (without the cache)"},
    {"duration", "60", "seconds over which conversations start"},
    {"n", "", "number of conversations (instead of duration)"},
    {"system_prompts", "8", "distinct system prompts, shared by every conversation that uses one"},
    {"system_len", "256", "tokens of a system prompt"},
    {"turns", "1-6",
     "turns per conversation: N or LO-HI; each prompt extends the last prompt and its answer"},
    {"user", "16-64", "tokens of a user message (each turn): N, LO-HI or exp:MEAN"},
    {"output", "32-128", "tokens of an answer: N, LO-HI or exp:MEAN"},
    {"think", "1-5", "seconds between a turn's arrival and the next one's: LO-HI"},
    {"one_off", "0.1", "fraction of conversations that are one unique prompt (no system prompt)"},
    {"tenants", "1", "tenants u0..uN-1, conversations dealt round robin (domains decide sharing)"},
    {"block", "", "tokens per block hash (default: the service model's KV block size)"},
    {NULL, NULL, NULL}};

static const struct workload_def {
    const char *name, *what;
    int kind;
    const param_def *params;
} workloads[] = {
    {"poisson", "open-loop Poisson arrivals", SIM_SCN_NONE, p_open},
    {"gamma", "open-loop gamma arrivals with a given CV (bursty when cv > 1)", SIM_SCN_NONE,
     p_open},
    {"long-prompt",
     "one very long prompt plus short chats: do short requests still get a first token promptly?",
     SIM_SCN_LONG_PROMPT, p_long},
    {"two-tenants", "two tenants with unequal rates: does the quiet one get its fair share?",
     SIM_SCN_TWO_TENANTS, p_two},
    {"disconnects", "clients disconnect during decode: are compute and cache reclaimed at once?",
     SIM_SCN_DISCONNECTS, p_disc},
    {"burst", "arrival rate briefly exceeds service rate: does queue time return to baseline?",
     SIM_SCN_BURST, p_burst},
    {"overload", "sustained excess token work: are rejects bounded, intentional and explained?",
     SIM_SCN_OVERLOAD, p_over},
    {"shared-prefix",
     "system prompts shared by many users, multi-turn chats, some one-off prompts: the prefix "
     "cache's workload",
     SIM_SCN_SHARED_PREFIX, p_shared},
};
#define N_WORKLOADS (sizeof workloads / sizeof *workloads)

const char *sim_gen_help(void)
{
    static char buf[8192];
    size_t o = 0;
    for (size_t i = 0; i < N_WORKLOADS && o < sizeof buf; i++) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s — %s\n", workloads[i].name,
                              workloads[i].what);
        for (const param_def *p = workloads[i].params; p->key && o < sizeof buf; p++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "    %-16s %-10s %s\n", p->key,
                                  *p->def ? p->def : "-", p->help);
    }
    return buf;
}

typedef struct params {
    const param_def *defs;
    const char *val[32];
    const char *wl;
} params;

static const char *pget(const params *p, const char *key)
{
    for (int i = 0; p->defs[i].key; i++)
        if (strcmp(p->defs[i].key, key) == 0) return p->val[i];
    return "";
}

static int pnum(const params *p, const char *key, double lo, double hi, double *out)
{
    const char *s = pget(p, key);
    char *e;
    double v = strtod(s, &e);
    if (!*s || *e || !(v >= lo && v <= hi))
        return sim_err_set("workload %s: %s=%s must be a number in [%g, %g]", p->wl, key, s, lo,
                           hi);
    *out = v;
    return 0;
}

/* A length distribution: fixed, uniform LO-HI, or exponential with a mean. */
typedef struct lendist {
    int kind;
    double a, b;
} lendist;

static int plen(const params *p, const char *key, lendist *d)
{
    const char *s = pget(p, key);
    char *e;
    if (strncmp(s, "exp:", 4) == 0) {
        d->kind = 2;
        d->a = strtod(s + 4, &e);
        if (e != s + 4 && !*e && d->a >= 1) return 0;
    } else {
        d->a = strtod(s, &e);
        if (e != s && !*e && d->a >= 1) {
            d->kind = 0;
            return 0;
        }
        if (e != s && *e == '-') {
            char *e2;
            d->b = strtod(e + 1, &e2);
            if (e2 != e + 1 && !*e2 && d->a >= 1 && d->b >= d->a) {
                d->kind = 1;
                return 0;
            }
        }
    }
    return sim_err_set("workload %s: %s=%s: expected N, LO-HI or exp:MEAN (tokens >= 1)", p->wl,
                       key, s);
}

static double len_mean(const lendist *d)
{
    return d->kind == 1 ? (d->a + d->b) / 2 : d->a;
}

static uint32_t len_draw(const lendist *d, sim_rng *r)
{
    double v;
    switch (d->kind) {
    case 1: v = (double)sim_rng_range(r, (uint64_t)d->a, (uint64_t)d->b); break;
    case 2: v = ceil(sim_rng_exp(r, d->a)); break;
    default: v = d->a;
    }
    return v < 1 ? 1 : v > 1e9 ? 1000000000u : (uint32_t)v;
}

/* ---- the generator state ------------------------------------------------------------------ */

typedef struct gen {
    sim_trace *t;
    sim_rng rng;
    lendist prompt, output;
    sim_trace emp; /* empirical (prompt, output) pairs, when lengths= is given */
    bool use_emp;
    uint64_t next_id;
    uint32_t samples;          /* n per prompt (0, 1: one) */
    bool logprobs, processors; /* what every request's rows cost */
} gen;

static int gen_lengths_init(gen *g, const params *p)
{
    int rc;
    const char *file = pget(p, "lengths");
    if (*file) {
        sim_trace_init(&g->emp, file);
        if ((rc = sim_trace_load(&g->emp, file, SIM_FMT_AUTO, false)) < 0) return rc;
        if (g->emp.n == 0)
            return sim_err_set("workload %s: lengths=%s has no requests", p->wl, file);
        g->use_emp = true;
        return 0;
    }
    if ((rc = plen(p, "prompt", &g->prompt)) || (rc = plen(p, "output", &g->output))) return rc;
    return 0;
}

static void gen_mean_lengths(const gen *g, double *prompt, double *output)
{
    if (g->use_emp) {
        sim_trace_summary s;
        sim_trace_summarise(&g->emp, &s);
        *prompt = s.prompt_mean;
        *output = s.output_mean;
    } else {
        *prompt = len_mean(&g->prompt);
        *output = len_mean(&g->output);
        if (g->prompt.kind == 2) *prompt = g->prompt.a;
        if (g->output.kind == 2) *output = g->output.a;
    }
}

static int gen_add(gen *g, int64_t at_us, int tenant, int klass)
{
    sim_req r;
    memset(&r, 0, sizeof r);
    r.deadline_us = r.cancel_us = r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
    r.arrival_us = at_us;
    if (g->use_emp) {
        /* joint draw keeps the correlation between prompt and output lengths of the trace */
        const sim_req *e = &g->emp.reqs[sim_rng_range(&g->rng, 0, g->emp.n - 1)];
        r.prompt_tokens = e->prompt_tokens;
        r.output_tokens = e->output_tokens;
    } else {
        r.prompt_tokens = len_draw(&g->prompt, &g->rng);
        r.output_tokens = len_draw(&g->output, &g->rng);
    }
    r.max_tokens = r.output_tokens;
    r.tenant = (uint16_t)tenant;
    r.klass = (uint16_t)klass;
    r.logprobs = g->logprobs;
    r.processors = g->processors;
    r.src_id = g->next_id++;
    int rc = sim_trace_push(g->t, &r);
    /* n samples: the others of the same prompt and lengths, after the first in the trace */
    uint64_t first = r.src_id + 1; /* sample_of: 1 + the first's src_id */
    for (uint32_t i = 1; !rc && i < g->samples; i++) {
        r.sample_of = first;
        r.src_id = g->next_id++;
        rc = sim_trace_push(g->t, &r);
    }
    return rc;
}

/* Poisson (cv = 1) or gamma arrivals at `rate` over [from, to) µs, with a tenant and class. */
static int gen_arrivals(gen *g, double rate, double cv, int64_t from, int64_t to, size_t max_n,
                        int tenant, int klass)
{
    if (!(rate > 0)) return 0;
    double mean_us = 1e6 / rate, k = 1.0 / (cv * cv), t = (double)from;
    size_t n = 0;
    for (;;) {
        double gap =
            cv == 1 ? sim_rng_exp(&g->rng, mean_us) : sim_rng_gamma(&g->rng, k) * mean_us / k;
        t += gap;
        if ((to > 0 && t >= (double)to) || (max_n && n >= max_n)) break;
        int rc = gen_add(g, (int64_t)llround(t), tenant, klass);
        if (rc < 0) return rc;
        n++;
    }
    return 0;
}

static int parse_params(const struct workload_def *w, const char *const *kv, size_t n, params *p)
{
    memset(p, 0, sizeof *p);
    p->defs = w->params;
    p->wl = w->name;
    for (int i = 0; w->params[i].key; i++) p->val[i] = w->params[i].def;
    for (size_t j = 0; j < n; j++) {
        const char *eq = strchr(kv[j], '=');
        if (!eq)
            return sim_err_set("workload %s: parameter \"%s\" is not key=value", w->name, kv[j]);
        size_t kl = (size_t)(eq - kv[j]);
        int i;
        for (i = 0; w->params[i].key; i++)
            if (strlen(w->params[i].key) == kl && memcmp(w->params[i].key, kv[j], kl) == 0) break;
        if (!w->params[i].key) {
            char known[512] = "";
            for (int k = 0; w->params[k].key; k++) {
                strncat(known, " ", sizeof known - strlen(known) - 1);
                strncat(known, w->params[k].key, sizeof known - strlen(known) - 1);
            }
            return sim_err_set("workload %s: unknown parameter \"%.*s\" (known:%s)", w->name,
                               (int)kl, kv[j], known);
        }
        p->val[i] = eq + 1;
    }
    return 0;
}

/* Capacity estimate at a moderate decode batch: the point is to size loads relative to the
 * machine described by the service model, so a calibration of a small CPU model and the
 * built-in H200 default both give a meaningful "2x overload". */
static double capacity(const sim_service *svc, double prompt, double output)
{
    /* a busy server runs a large decode batch; a small KV pool (a CPU calibration) caps it */
    double fit = (double)svc->kv_blocks_device * svc->kv_block_size / (prompt + output);
    double batch = fit < 128 ? fit : 128;
    return sim_service_capacity_rps(svc, prompt, output, batch < 1 ? 1 : batch);
}

/* ---- shared-prefix ------------------------------------------------------------------------ */

/* Block hashes of the full blocks of tokens tok[0..n): block b's hash chains block b-1's and
 * its tokens, so equal hashes at a position mean equal prefixes.  Full blocks only, as
 * ringlmd logs its keys: a turn's prompt takes the first n_prompt / bs, its answer the rest
 * of the chain (answer_hash_ids: the first may hold the prompt's last tokens), and the next
 * turn, whose prompt is this prompt and answer extended, repeats them all. */
static uint32_t block_hashes(const int32_t *tok, uint32_t n, uint32_t bs, uint64_t *out)
{
    uint64_t h = 0x6a09e667f3bcc908ull;
    uint32_t nb = 0;
    for (uint32_t b = 0; (b + 1) * bs <= n; b++) {
        for (uint32_t k = b * bs; k < (b + 1) * bs; k++) {
            uint64_t x = h ^ (uint64_t)(uint32_t)tok[k];
            h = sim_splitmix64(&x);
        }
        out[nb++] = h & 0x7fffffffffffffffull; /* a JSON integer */
    }
    return nb;
}

static uint32_t range_draw(sim_rng *r, double lo, double hi)
{
    return (uint32_t)sim_rng_range(r, (uint64_t)lo, (uint64_t)hi);
}

/* Conversations start as a Poisson process; each is one unique prompt (one_off) or a system
 * prompt followed by turns: user message → prompt (everything so far) → answer appended. */
static int gen_shared_prefix(gen *g, const params *p, const sim_service *svc, sim_scenario *scn)
{
    double sys_n, sys_len, one_off, ntn, bsz = svc->kv_block_size, d, n_conv = 0, load, rate;
    double tlo, thi, klo, khi;
    lendist user, out;
    int rc;
    if ((rc = pnum(p, "system_prompts", 1, 1e6, &sys_n)) ||
        (rc = pnum(p, "system_len", 0, 1e6, &sys_len)) ||
        (rc = pnum(p, "one_off", 0, 1, &one_off)) ||
        (rc = pnum(p, "tenants", 1, SIM_MAX_NAMES, &ntn)) || (rc = plen(p, "user", &user)) ||
        (rc = plen(p, "output", &out)) || (rc = pnum(p, "load", 1e-6, 1e6, &load)))
        return rc;
    if (*pget(p, "block") && (rc = pnum(p, "block", 1, 1 << 20, &bsz))) return rc;
    if (bsz < 1) bsz = 16;
    const char *ts = pget(p, "turns"), *ks = pget(p, "think");
    char *e;
    tlo = strtod(ts, &e);
    thi = tlo;
    if (e != ts && *e == '-') thi = strtod(e + 1, &e);
    if (*e || !(tlo >= 1) || thi < tlo || thi > 10000)
        return sim_err_set("workload shared-prefix: turns=%s: expected N or LO-HI (1..10000)", ts);
    klo = strtod(ks, &e);
    khi = klo;
    if (e != ks && *e == '-') khi = strtod(e + 1, &e);
    if (*e || !(klo >= 0) || khi < klo)
        return sim_err_set("workload shared-prefix: think=%s: expected LO-HI seconds", ks);
    double mean_turns = (tlo + thi) / 2 * (1 - one_off) + one_off;
    double mp =
        sys_len + len_mean(&user) * (mean_turns + 1) / 2 + len_mean(&out) * (mean_turns - 1) / 2;
    rate = load * capacity(svc, mp, len_mean(&out));
    if (*pget(p, "rate") && (rc = pnum(p, "rate", 1e-9, 1e9, &rate))) return rc;
    if (*pget(p, "n") && (rc = pnum(p, "n", 1, 1e8, &n_conv))) return rc;
    if ((rc = pnum(p, "duration", 0.001, 1e7, &d))) return rc;
    int64_t dur = n_conv > 0 ? 0 : (int64_t)llround(d * 1e6);
    int tn[SIM_MAX_NAMES];
    for (int i = 0; i < (int)ntn; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "u%d", i);
        if ((tn[i] = sim_trace_tenant(g->t, nm)) < 0) return tn[i];
    }
    int cls = sim_trace_class(g->t, "default");
    uint32_t bs = (uint32_t)bsz;
    size_t cap = 0;
    int32_t *tok = NULL;
    uint64_t *ids = NULL;
    double conv_rate = rate / mean_turns, t = 0;
    rc = 0;
    for (size_t c = 0; (n_conv > 0 ? c < (size_t)n_conv : true) && !rc; c++) {
        t += sim_rng_exp(&g->rng, 1e6 / conv_rate);
        if (dur && t >= (double)dur) break;
        bool single = sim_rng_unif(&g->rng) < one_off;
        uint32_t turns = single ? 1 : range_draw(&g->rng, tlo, thi),
                 sys = single ? 0 : (uint32_t)sys_len;
        uint64_t sys_id = sim_rng_range(&g->rng, 0, (uint64_t)sys_n - 1);
        size_t n = 0;
        double at = t;
        for (uint32_t k = 0; k < turns && !rc; k++) {
            uint32_t nu = len_draw(&user, &g->rng) + (single ? (uint32_t)sys_len : 0),
                     no = len_draw(&out, &g->rng);
            size_t need = (k ? n : sys) + nu + no;
            if (need > cap) {
                size_t nc = cap ? cap : 1024;
                while (nc < need) nc *= 2;
                int32_t *nt = realloc(tok, nc * sizeof *nt);
                uint64_t *ni = nt ? realloc(ids, (nc / bs + 2) * sizeof *ni) : NULL;
                if (nt) tok = nt;
                if (!nt || !ni) {
                    rc = -ENOMEM;
                    break;
                }
                ids = ni;
                cap = nc;
            }
            if (k == 0) /* the system prompt: the same tokens wherever it is used */
                for (uint64_t x = 0x243f6a8885a308d3ull ^ (sys_id * 0x9e3779b97f4a7c15ull);
                     n < sys;)
                    tok[n++] = (int32_t)(sim_splitmix64(&x) >> 33);
            for (uint32_t i = 0; i < nu; i++) tok[n++] = (int32_t)(sim_rng_u64(&g->rng) >> 33);
            sim_req r;
            memset(&r, 0, sizeof r);
            r.deadline_us = r.cancel_us = r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
            r.arrival_us = (int64_t)llround(at);
            r.prompt_tokens = (uint32_t)n;
            r.output_tokens = r.max_tokens = no;
            r.tenant = (uint16_t)tn[c % (size_t)ntn];
            r.klass = (uint16_t)cls;
            r.src_id = g->next_id++;
            for (uint32_t i = 0; i < no; i++)
                tok[n + i] = (int32_t)(sim_rng_u64(&g->rng) >> 33); /* the answer */
            /* the prompt's full blocks, then the answer's (the chain going on over prompt +
             * answer): replayed, the answer's tokens stand in for these and its blocks are
             * cached when it ends, as ringlmd caches them (prefix_cache_generated) */
            uint32_t np = (uint32_t)(n / bs), nb = block_hashes(tok, (uint32_t)(n + no), bs, ids);
            if ((rc = sim_trace_push_hashed(g->t, &r, ids, np, ids + np, nb - np, bs)) < 0) break;
            n += no;
            at += (klo + (khi - klo) * sim_rng_unif(&g->rng)) * 1e6;
        }
    }
    free(tok);
    free(ids);
    scn->load = rate / capacity(svc, mp, len_mean(&out));
    scn->duration_us = dur;
    return rc;
}

int sim_gen_workload(sim_trace *t, const char *name, const char *const *kv, size_t n_kv,
                     const sim_service *svc, uint64_t seed, sim_scenario *scn)
{
    const struct workload_def *w = NULL;
    for (size_t i = 0; i < N_WORKLOADS; i++)
        if (strcmp(workloads[i].name, name) == 0) w = &workloads[i];
    if (!w)
        return sim_err_set("unknown workload \"%s\" (known: poisson gamma long-prompt two-tenants "
                           "disconnects burst overload shared-prefix)",
                           name);
    params p;
    int rc = parse_params(w, kv, n_kv, &p);
    if (rc) return rc;
    char src[256];
    snprintf(src, sizeof src, "workload:%s", name);
    sim_trace_init(t, src);
    memset(scn, 0, sizeof *scn);
    scn->kind = w->kind;
    gen g;
    memset(&g, 0, sizeof g);
    g.t = t;
    sim_rng_seed(&g.rng, seed);
    if (w->kind == SIM_SCN_SHARED_PREFIX)
        g.prompt = g.output = (lendist){0, 1, 0}; /* its own lengths */
    else if ((rc = gen_lengths_init(&g, &p)))
        goto out;
    double mp, mo, d, load;
    gen_mean_lengths(&g, &mp, &mo);
    double cap = capacity(svc, mp, mo);
    scn->capacity_rps = cap;
    if ((rc = pnum(&p, "duration", 0.001, 1e7, &d)) && w->kind != SIM_SCN_NONE) goto out;
    int64_t dur = (int64_t)llround(d * 1e6);
    scn->duration_us = dur;
    int def_t = sim_trace_tenant(t, "default"), def_c = sim_trace_class(t, "default");
    switch (w->kind) {
    case SIM_SCN_NONE: {
        double rate, cv = 1, n = 0;
        if ((rc = pnum(&p, "load", 1e-6, 1e6, &load))) goto out;
        rate = load * cap;
        if (*pget(&p, "rate") && (rc = pnum(&p, "rate", 1e-9, 1e9, &rate))) goto out;
        if (strcmp(name, "gamma") == 0 && (rc = pnum(&p, "cv", 0.01, 100, &cv))) goto out;
        double ns = 1, lpf = 0, prf = 0;
        if ((rc = pnum(&p, "samples", 1, 256, &ns)) || (rc = pnum(&p, "logprobs", 0, 1, &lpf)) ||
            (rc = pnum(&p, "processors", 0, 1, &prf)))
            goto out;
        g.samples = (uint32_t)ns;
        g.logprobs = lpf > 0;
        g.processors = prf > 0;
        if (*pget(&p, "arrivals_from")) {
            /* fit the arrival process to a trace: its mean rate and the CV of its gaps */
            sim_trace a;
            sim_trace_init(&a, pget(&p, "arrivals_from"));
            if ((rc = sim_trace_load(&a, pget(&p, "arrivals_from"), SIM_FMT_AUTO, false)) < 0)
                goto out;
            if (a.n < 3) {
                sim_trace_free(&a);
                rc = sim_err_set("workload %s: arrivals_from has fewer than 3 requests", name);
                goto out;
            }
            double m = 0, v = 0, k = (double)(a.n - 1);
            for (size_t i = 1; i < a.n; i++)
                m += (double)(a.reqs[i].arrival_us - a.reqs[i - 1].arrival_us);
            m /= k;
            for (size_t i = 1; i < a.n; i++) {
                double dd = (double)(a.reqs[i].arrival_us - a.reqs[i - 1].arrival_us) - m;
                v += dd * dd;
            }
            sim_trace_free(&a);
            if (!(m > 0)) {
                rc = sim_err_set("workload %s: arrivals_from has no time between arrivals", name);
                goto out;
            }
            rate = 1e6 / m;
            if (strcmp(name, "gamma") == 0) cv = fmax(0.01, sqrt(v / k) / m);
        }
        if (*pget(&p, "n") && (rc = pnum(&p, "n", 1, 1e8, &n))) goto out;
        if (n > 0)
            dur = 0;
        else if ((rc = pnum(&p, "duration", 0.001, 1e7, &d)))
            goto out;
        if ((rc = gen_arrivals(&g, rate, cv, 0, dur, (size_t)n, def_t, def_c))) goto out;
        if (*pget(&p, "tenants") && (rc = sim_trace_assign(t, 0, pget(&p, "tenants"), seed)))
            goto out;
        if (*pget(&p, "classes") &&
            (rc = sim_trace_assign(t, 1, pget(&p, "classes"), seed ^ 0x5bd1e995)))
            goto out;
        if (*pget(&p, "deadline_ms")) {
            double dl;
            if ((rc = pnum(&p, "deadline_ms", 0.001, 1e9, &dl))) goto out;
            for (size_t i = 0; i < t->n; i++)
                t->reqs[i].deadline_us = t->reqs[i].arrival_us + (int64_t)llround(dl * 1000);
        }
        scn->load = rate / cap;
        break;
    }
    case SIM_SCN_LONG_PROMPT: {
        double lp, lo, at;
        if ((rc = pnum(&p, "load", 1e-6, 100, &load)) || (rc = pnum(&p, "long", 1, 1e8, &lp)) ||
            (rc = pnum(&p, "long_output", 1, 1e8, &lo)) || (rc = pnum(&p, "long_at", 0, d, &at)) ||
            (rc = pnum(&p, "ttft_limit_ms", 0, 1e9, &scn->ttft_limit_ms)) ||
            (rc = pnum(&p, "stall_limit_ms", 0, 1e9, &scn->stall_limit_ms)))
            goto out;
        int chat = sim_trace_tenant(t, "chat"), bulk = sim_trace_tenant(t, "bulk");
        int inter = sim_trace_class(t, "interactive"), batch = sim_trace_class(t, "batch");
        if ((rc = gen_arrivals(&g, load * cap, 1, 0, dur, 0, chat, inter))) goto out;
        scn->short_class = inter;
        scn->long_at_us = (int64_t)llround(at * 1e6);
        sim_req r;
        memset(&r, 0, sizeof r);
        r.deadline_us = r.cancel_us = r.real_first_token_us = r.real_finish_us = SIM_NO_TIME;
        r.arrival_us = scn->long_at_us;
        r.prompt_tokens = (uint32_t)lp;
        r.output_tokens = r.max_tokens = (uint32_t)lo;
        r.tenant = (uint16_t)bulk;
        r.klass = (uint16_t)batch;
        r.src_id = g.next_id++;
        if ((rc = sim_trace_push(t, &r))) goto out;
        scn->load = load;
        break;
    }
    case SIM_SCN_TWO_TENANTS: {
        double ratio;
        if ((rc = pnum(&p, "load", 1e-6, 100, &load)) || (rc = pnum(&p, "ratio", 1, 1e6, &ratio)) ||
            (rc = pnum(&p, "share_min", 0, 1, &scn->share_min)))
            goto out;
        int quiet = sim_trace_tenant(t, "quiet"), loud = sim_trace_tenant(t, "loud");
        int c = sim_trace_class(t, "standard");
        double total = load * cap;
        if ((rc = gen_arrivals(&g, total / (ratio + 1), 1, 0, dur, 0, quiet, c)) ||
            (rc = gen_arrivals(&g, total * ratio / (ratio + 1), 1, 0, dur, 0, loud, c)))
            goto out;
        scn->quiet_tenant = quiet;
        scn->loud_tenant = loud;
        scn->load = load;
        break;
    }
    case SIM_SCN_DISCONNECTS: {
        double frac;
        lendist after;
        if ((rc = pnum(&p, "load", 1e-6, 100, &load)) ||
            (rc = pnum(&p, "cancel_frac", 0, 1, &frac)))
            goto out;
        const char *ca = pget(&p, "cancel_after");
        char *e;
        after.a = strtod(ca, &e);
        after.b = after.a;
        if (e != ca && *e == '-') after.b = strtod(e + 1, &e);
        if (*e || !(after.a >= 0) || after.b < after.a) {
            rc = sim_err_set("workload disconnects: cancel_after=%s: expected LO-HI seconds", ca);
            goto out;
        }
        int c = sim_trace_class(t, "interactive");
        if ((rc = gen_arrivals(&g, load * cap, 1, 0, dur, 0, def_t, c))) goto out;
        for (size_t i = 0; i < t->n; i++) {
            if (sim_rng_unif(&g.rng) >= frac) continue;
            double s = after.a + (after.b - after.a) * sim_rng_unif(&g.rng);
            t->reqs[i].cancel_us = t->reqs[i].arrival_us + (int64_t)llround(s * 1e6);
        }
        scn->load = load;
        break;
    }
    case SIM_SCN_BURST: {
        double bl, at, bs;
        if ((rc = pnum(&p, "load", 1e-6, 100, &load)) ||
            (rc = pnum(&p, "burst_load", 1e-6, 1000, &bl)) ||
            (rc = pnum(&p, "burst_at", 0, d, &at)) || (rc = pnum(&p, "burst_s", 0.001, d, &bs)) ||
            (rc = pnum(&p, "recover_limit_s", 0, 1e7, &scn->recover_limit_s)))
            goto out;
        int c = sim_trace_class(t, "interactive");
        int64_t b0 = (int64_t)llround(at * 1e6), b1 = (int64_t)llround((at + bs) * 1e6);
        if (b1 > dur) b1 = dur;
        if ((rc = gen_arrivals(&g, load * cap, 1, 0, b0, 0, def_t, c)) ||
            (rc = gen_arrivals(&g, bl * cap, 1, b0, b1, 0, def_t, c)) ||
            (rc = gen_arrivals(&g, load * cap, 1, b1, dur, 0, def_t, c)))
            goto out;
        scn->burst_start_us = b0;
        scn->burst_end_us = b1;
        scn->load = load;
        break;
    }
    case SIM_SCN_SHARED_PREFIX:
        if ((rc = gen_shared_prefix(&g, &p, svc, scn))) goto out;
        break;
    case SIM_SCN_OVERLOAD: {
        if ((rc = pnum(&p, "load", 1e-6, 100, &load)) ||
            (rc = pnum(&p, "slo_min", 0, 1, &scn->slo_min)))
            goto out;
        int c = sim_trace_class(t, "interactive");
        if ((rc = gen_arrivals(&g, load * cap, 1, 0, dur, 0, def_t, c))) goto out;
        scn->load = load;
        break;
    }
    }
    sim_trace_sort(t);
    /* drop names nothing uses, so reports list only real tenants/classes */
    rc = 0;
out:
    if (g.use_emp) sim_trace_free(&g.emp);
    if (rc) sim_trace_free(t);
    return rc;
}
