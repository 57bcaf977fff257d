/* SPDX-License-Identifier: MIT */
/* policy.c — the policy file: parser (own INI-style reader, so every error carries its line
 * and reason and duplicate keys are caught), canonical text form and its FNV-1a 64 hash. */
#include "sched/sched.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sched__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef struct uid_map {
    uint32_t uid;
    int32_t tenant;
    int line;
} uid_map;

struct sched_policy {
    sched_policy_cfg cfg;
    int n_classes, n_tenants;
    sched_class_cfg classes[SCHED_MAX_CLASSES];
    sched_tenant_cfg tenants[SCHED_MAX_TENANTS];
    uint32_t n_uids, n_trusted;
    uid_map uids[SCHED_MAX_UIDS];     /* sorted by uid after parse */
    uint32_t trusted[SCHED_MAX_UIDS]; /* sorted */
    char *canonical;
    uint64_t hash;
    char hash_hex[SCHED_HASH_HEX_LEN + 1];
};

/* ---- defaults ---------------------------------------------------------------------------- */

static void default_cfg(sched_policy_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->mode = SCHED_MODE_TOKEN_BUDGET;
    c->token_budget = 512;
    c->max_active_seqs = 256;
    c->prefill_chunk = 256;
    c->decode_reserve_tokens = 0;
    c->kv_charge_per_block_s = 1.0;
    c->preemption = SCHED_PREEMPT_AUTO;
    c->min_residency_us = 0;
    c->max_preemptions = 4;
    c->static_batch_size = 8;
    c->static_batch_timeout_us = 50000;
    c->dynamic_window_us = 5000;
    c->backpressure_timeout_us = 0;
    c->default_class = 0;
    c->default_tenant = -1;
}

static void default_class(sched_class_cfg *c, const char *name)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->aging_per_s = 1.0;
}

static void default_tenant(sched_tenant_cfg *t, const char *name)
{
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    snprintf(t->cache_domain, sizeof(t->cache_domain), "%s", name); /* its own domain */
    t->weight = 1.0;
}

/* ---- parser state ------------------------------------------------------------------------ */

enum section { SEC_NONE, SEC_SCHED, SEC_CLASS, SEC_TENANT, SEC_TRUST };

#define MAX_SEEN 64
typedef struct parser {
    sched_policy *p;
    sched_policy_error *err;
    int line;
    enum section sec;
    int idx;                 /* class/tenant index of the section */
    char seen[MAX_SEEN][40]; /* keys seen in this section (duplicates) */
    int n_seen;
    char default_class[SCHED_NAME_MAX];
    int default_class_line;
    char default_tenant[SCHED_NAME_MAX];
    int default_tenant_line;
    bool default_tenant_set, default_class_set;
    bool sched_seen, trust_seen;
    int gather_line, gather_max_line;  /* burst_gather, burst_gather_max (0 = not given) */
    int order_line[SCHED_MAX_CLASSES]; /* prefix_order, prefix_max_wait: */
    int pmw_line[SCHED_MAX_CLASSES];   /* their lines (0 = not given) */
} parser;

static int fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *ps, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (ps->err) {
        ps->err->line = ps->line;
        snprintf(ps->err->reason, sizeof(ps->err->reason), "%s", msg);
    }
    if (ps->line)
        sched__set_error("policy line %d: %s", ps->line, msg);
    else
        sched__set_error("policy: %s", msg);
    return -EINVAL;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= SCHED_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
    return s;
}

/* ---- value readers ----------------------------------------------------------------------- */

static int rd_u64(parser *ps, const char *key, const char *v, uint64_t max, uint64_t *out)
{
    char *end;
    if (!*v || *v == '-' || *v == '+') goto bad;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || x > max) goto bad;
    *out = x;
    return 0;
bad:
    return fail(ps, "key \"%s\": expected a whole number 0..%llu, got \"%s\"", key,
                (unsigned long long)max, v);
}

static int rd_u32(parser *ps, const char *key, const char *v, uint32_t min, uint32_t *out)
{
    uint64_t x;
    int rc = rd_u64(ps, key, v, UINT32_MAX, &x);
    if (rc) return rc;
    if (x < min) return fail(ps, "key \"%s\": must be >= %u, got %s", key, min, v);
    *out = (uint32_t)x;
    return 0;
}

static int rd_double(parser *ps, const char *key, const char *v, double min, bool min_open,
                     double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || errno || *end || !isfinite(x) || x > 1e15)
        return fail(ps, "key \"%s\": expected a number, got \"%s\"", key, v);
    if (min_open ? !(x > min) : !(x >= min))
        return fail(ps, "key \"%s\": must be %s %g, got %s", key, min_open ? ">" : ">=", min, v);
    *out = x == 0 ? 0 : x; /* fold -0 */
    return 0;
}

/* Durations: a number with an optional unit us|ms|s; bare numbers are microseconds. */
static int rd_dur(parser *ps, const char *key, const char *v, uint64_t *out)
{
    char num[64];
    size_t n = strlen(v);
    double mul = 1;
    if (n > 2 && !strcmp(v + n - 2, "us")) {
        n -= 2;
        mul = 1;
    } else if (n > 2 && !strcmp(v + n - 2, "ms")) {
        n -= 2;
        mul = 1e3;
    } else if (n > 1 && v[n - 1] == 's') {
        n -= 1;
        mul = 1e6;
    }
    if (n == 0 || n >= sizeof(num)) goto bad;
    memcpy(num, v, n);
    num[n] = 0;
    char *t = trim(num);
    char *end;
    errno = 0;
    double x = strtod(t, &end);
    if (!*t || errno || *end || !isfinite(x) || x < 0 || x * mul > 1e15) goto bad;
    *out = (uint64_t)llround(x * mul);
    return 0;
bad:
    return fail(ps, "key \"%s\": expected a duration like 250us, 20ms or 2s, got \"%s\"", key, v);
}

static int rd_bool(parser *ps, const char *key, const char *v, bool *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1"}, *const no[] = {"no", "false",
                                                                                "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(v, no[i])) {
            *out = false;
            return 0;
        }
    }
    return fail(ps, "key \"%s\": expected yes or no, got \"%s\"", key, v);
}

static int rd_enum(parser *ps, const char *key, const char *v, const char *(*name)(int), int n,
                   int *out)
{
    char opts[160] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, name(i))) {
            *out = i;
            return 0;
        }
        size_t l = strlen(opts);
        snprintf(opts + l, sizeof(opts) - l, "%s%s", i ? "|" : "", name(i));
    }
    return fail(ps, "key \"%s\": expected %s, got \"%s\"", key, opts, v);
}
static const char *mode_name_i(int i)
{
    return sched_mode_name((sched_mode)i);
}
static const char *pre_name_i(int i)
{
    return sched_preempt_mode_name((sched_preempt_mode)i);
}
static const char *order_name_i(int i)
{
    return sched_prefix_order_name((sched_prefix_order)i);
}

/* uid lists: numbers separated by spaces or commas. */
static int rd_uids(parser *ps, const char *key, const char *v, bool trust)
{
    sched_policy *p = ps->p;
    const char *c = v;
    while (*c) {
        while (*c == ' ' || *c == '\t' || *c == ',') c++;
        if (!*c) break;
        char tok[32];
        size_t n = strcspn(c, " \t,");
        if (n >= sizeof(tok)) return fail(ps, "key \"%s\": uid \"%.20s...\" is too long", key, c);
        memcpy(tok, c, n);
        tok[n] = 0;
        c += n;
        uint64_t uid;
        int rc = rd_u64(ps, key, tok, UINT32_MAX - 1, &uid);
        if (rc) return rc;
        if (trust) {
            for (uint32_t i = 0; i < p->n_trusted; i++)
                if (p->trusted[i] == uid)
                    return fail(ps, "key \"%s\": uid %s listed twice", key, tok);
            if (p->n_trusted >= SCHED_MAX_UIDS)
                return fail(ps, "key \"%s\": more than %d trusted uids", key, SCHED_MAX_UIDS);
            p->trusted[p->n_trusted++] = (uint32_t)uid;
        } else {
            for (uint32_t i = 0; i < p->n_uids; i++)
                if (p->uids[i].uid == uid)
                    return fail(ps, "key \"%s\": uid %s already mapped to tenant \"%s\" (line %d)",
                                key, tok, p->tenants[p->uids[i].tenant].name, p->uids[i].line);
            if (p->n_uids >= SCHED_MAX_UIDS)
                return fail(ps, "key \"%s\": more than %d mapped uids", key, SCHED_MAX_UIDS);
            p->uids[p->n_uids++] = (uid_map){(uint32_t)uid, ps->idx, ps->line};
        }
    }
    return 0;
}

/* ---- one key = value --------------------------------------------------------------------- */

static int set_key(parser *ps, const char *key, const char *v)
{
    sched_policy *p = ps->p;
    for (int i = 0; i < ps->n_seen; i++)
        if (!strcmp(ps->seen[i], key))
            return fail(ps, "key \"%s\" given twice in this section", key);
    if (ps->n_seen < MAX_SEEN && strlen(key) < sizeof(ps->seen[0]))
        strcpy(ps->seen[ps->n_seen++], key);

    int e;
    switch (ps->sec) {
    case SEC_SCHED: {
        sched_policy_cfg *c = &p->cfg;
        if (!strcmp(key, "mode")) {
            int rc = rd_enum(ps, key, v, mode_name_i, 4, &e);
            if (!rc) c->mode = (sched_mode)e;
            return rc;
        }
        if (!strcmp(key, "preemption")) {
            int rc = rd_enum(ps, key, v, pre_name_i, 3, &e);
            if (!rc) c->preemption = (sched_preempt_mode)e;
            return rc;
        }
        if (!strcmp(key, "token_budget")) return rd_u32(ps, key, v, 1, &c->token_budget);
        if (!strcmp(key, "max_active_seqs")) return rd_u32(ps, key, v, 1, &c->max_active_seqs);
        if (!strcmp(key, "prefill_chunk")) return rd_u32(ps, key, v, 1, &c->prefill_chunk);
        if (!strcmp(key, "decode_reserve_tokens"))
            return rd_u32(ps, key, v, 0, &c->decode_reserve_tokens);
        if (!strcmp(key, "kv_charge_per_block_s"))
            return rd_double(ps, key, v, 0, false, &c->kv_charge_per_block_s);
        if (!strcmp(key, "min_residency")) return rd_dur(ps, key, v, &c->min_residency_us);
        if (!strcmp(key, "max_preemptions")) return rd_u32(ps, key, v, 0, &c->max_preemptions);
        if (!strcmp(key, "queue_max_requests"))
            return rd_u32(ps, key, v, 0, &c->queue_max_requests);
        if (!strcmp(key, "queue_max_tokens"))
            return rd_u64(ps, key, v, UINT64_MAX / 2, &c->queue_max_tokens);
        if (!strcmp(key, "static_batch_size")) return rd_u32(ps, key, v, 1, &c->static_batch_size);
        if (!strcmp(key, "static_batch_timeout"))
            return rd_dur(ps, key, v, &c->static_batch_timeout_us);
        if (!strcmp(key, "dynamic_window")) return rd_dur(ps, key, v, &c->dynamic_window_us);
        if (!strcmp(key, "backpressure_timeout"))
            return rd_dur(ps, key, v, &c->backpressure_timeout_us);
        if (!strcmp(key, "burst_gather")) {
            ps->gather_line = ps->line;
            return rd_dur(ps, key, v, &c->burst_gather_us);
        }
        if (!strcmp(key, "burst_gather_max")) {
            ps->gather_max_line = ps->line;
            return rd_dur(ps, key, v, &c->burst_gather_max_us);
        }
        if (!strcmp(key, "default_class")) {
            if (!valid_name(v)) return fail(ps, "key \"%s\": \"%s\" is not a class name", key, v);
            snprintf(ps->default_class, sizeof(ps->default_class), "%s", v);
            ps->default_class_line = ps->line;
            ps->default_class_set = true;
            return 0;
        }
        if (!strcmp(key, "default_tenant")) {
            if (*v && !valid_name(v))
                return fail(ps, "key \"%s\": \"%s\" is not a tenant name", key, v);
            snprintf(ps->default_tenant, sizeof(ps->default_tenant), "%s", v);
            ps->default_tenant_line = ps->line;
            ps->default_tenant_set = true;
            return 0;
        }
        return fail(ps, "unknown key \"%s\" in [scheduler]", key);
    }
    case SEC_CLASS: {
        sched_class_cfg *c = &p->classes[ps->idx];
        if (!strcmp(key, "priority")) {
            char *end;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (!*v || errno || *end || x < -1000000 || x > 1000000)
                return fail(
                    ps, "key \"priority\": expected a whole number -1000000..1000000, got \"%s\"",
                    v);
            c->priority = (int32_t)x;
            return 0;
        }
        if (!strcmp(key, "aging_per_s")) return rd_double(ps, key, v, 0, false, &c->aging_per_s);
        if (!strcmp(key, "ttft_target")) return rd_dur(ps, key, v, &c->ttft_target_us);
        if (!strcmp(key, "tpot_target")) return rd_dur(ps, key, v, &c->tpot_target_us);
        if (!strcmp(key, "max_queue_wait")) return rd_dur(ps, key, v, &c->max_queue_wait_us);
        if (!strcmp(key, "latency_sensitive")) return rd_bool(ps, key, v, &c->latency_sensitive);
        if (!strcmp(key, "prefix_order")) {
            int rc = rd_enum(ps, key, v, order_name_i, SCHED_PREFIX_ORDER__COUNT, &e);
            if (!rc) c->prefix_order = (sched_prefix_order)e;
            ps->order_line[ps->idx] = ps->line;
            return rc;
        }
        if (!strcmp(key, "prefix_max_wait")) {
            ps->pmw_line[ps->idx] = ps->line;
            return rd_dur(ps, key, v, &c->prefix_max_wait_us);
        }
        return fail(ps, "unknown key \"%s\" in [class %s]", key, c->name);
    }
    case SEC_TENANT: {
        sched_tenant_cfg *t = &p->tenants[ps->idx];
        if (!strcmp(key, "weight")) return rd_double(ps, key, v, 0, true, &t->weight);
        if (!strcmp(key, "max_queued_tokens"))
            return rd_u64(ps, key, v, UINT64_MAX / 2, &t->max_queued_tokens);
        if (!strcmp(key, "max_kv_blocks")) return rd_u32(ps, key, v, 0, &t->max_kv_blocks);
        if (!strcmp(key, "token_rate_per_s"))
            return rd_double(ps, key, v, 0, false, &t->token_rate_per_s);
        if (!strcmp(key, "uids")) return rd_uids(ps, key, v, false);
        if (!strcmp(key, "max_cached_blocks")) return rd_u32(ps, key, v, 0, &t->max_cached_blocks);
        if (!strcmp(key, "cache_per_uid")) return rd_bool(ps, key, v, &t->cache_per_uid);
        if (!strcmp(key, "cache_domain")) {
            if (!valid_name(v))
                return fail(
                    ps,
                    "key \"%s\": domain name \"%s\" must be 1-%d characters of A-Z a-z 0-9 _ . -",
                    key, v, SCHED_NAME_MAX - 1);
            snprintf(t->cache_domain, sizeof(t->cache_domain), "%s", v);
            return 0;
        }
        return fail(ps, "unknown key \"%s\" in [tenant %s]", key, t->name);
    }
    case SEC_TRUST:
        if (!strcmp(key, "uids")) return rd_uids(ps, key, v, true);
        return fail(ps, "unknown key \"%s\" in [trust]", key);
    case SEC_NONE:
    default:
        return fail(ps,
                    "key \"%s\" outside any section (start with [scheduler], [class NAME], "
                    "[tenant NAME] or [trust])",
                    key);
    }
}

static int open_section(parser *ps, char *hdr)
{
    sched_policy *p = ps->p;
    char *kind = trim(hdr), *name = kind;
    while (*name && *name != ' ' && *name != '\t') name++;
    if (*name) {
        *name++ = 0;
        name = trim(name);
    }
    ps->n_seen = 0;
    if (!strcmp(kind, "scheduler") || !strcmp(kind, "trust")) {
        bool sched = kind[0] == 's';
        if (*name) return fail(ps, "section [%s] takes no name", kind);
        if (sched ? ps->sched_seen : ps->trust_seen)
            return fail(ps, "section [%s] given twice", kind);
        if (sched)
            ps->sched_seen = true;
        else
            ps->trust_seen = true;
        ps->sec = sched ? SEC_SCHED : SEC_TRUST;
        return 0;
    }
    bool cls = !strcmp(kind, "class");
    if (!cls && strcmp(kind, "tenant"))
        return fail(ps, "unknown section [%s] (expected scheduler, class NAME, tenant NAME, trust)",
                    kind);
    if (!valid_name(name))
        return fail(ps, "section [%s]: name \"%s\" must be 1-%d characters of A-Z a-z 0-9 _ . -",
                    kind, name, SCHED_NAME_MAX - 1);
    if (cls) {
        for (int i = 0; i < p->n_classes; i++)
            if (!strcmp(p->classes[i].name, name))
                return fail(ps, "class \"%s\" defined twice", name);
        if (p->n_classes >= SCHED_MAX_CLASSES)
            return fail(ps, "more than %d classes", SCHED_MAX_CLASSES);
        ps->idx = p->n_classes++;
        default_class(&p->classes[ps->idx], name);
        ps->sec = SEC_CLASS;
    } else {
        for (int i = 0; i < p->n_tenants; i++)
            if (!strcmp(p->tenants[i].name, name))
                return fail(ps, "tenant \"%s\" defined twice", name);
        if (p->n_tenants >= SCHED_MAX_TENANTS)
            return fail(ps, "more than %d tenants", SCHED_MAX_TENANTS);
        ps->idx = p->n_tenants++;
        default_tenant(&p->tenants[ps->idx], name);
        ps->sec = SEC_TENANT;
    }
    return 0;
}

/* ---- canonical form ---------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sput(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sput(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* Shortest text that reads back as exactly the same double, so 0.5 and 0.50 agree. */
static void put_double(sbuf *b, const char *key, double v)
{
    char tmp[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    sput(b, "%s = %s\n", key, tmp);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_uidmap(const void *a, const void *b)
{
    return cmp_u32(a, b);
}
static int cmp_class(const void *a, const void *b)
{
    return strcmp(((const sched_class_cfg *)a)->name, ((const sched_class_cfg *)b)->name);
}
static int cmp_tenant(const void *a, const void *b)
{
    return strcmp(((const sched_tenant_cfg *)a)->name, ((const sched_tenant_cfg *)b)->name);
}

static int build_canonical(sched_policy *p)
{
    sbuf b = {0};
    const sched_policy_cfg *c = &p->cfg;
    sput(&b, "[scheduler]\n");
    sput(&b, "mode = %s\n", sched_mode_name(c->mode));
    sput(&b, "token_budget = %u\n", c->token_budget);
    sput(&b, "max_active_seqs = %u\n", c->max_active_seqs);
    sput(&b, "prefill_chunk = %u\n", c->prefill_chunk);
    sput(&b, "decode_reserve_tokens = %u\n", c->decode_reserve_tokens);
    put_double(&b, "kv_charge_per_block_s", c->kv_charge_per_block_s);
    sput(&b, "preemption = %s\n", sched_preempt_mode_name(c->preemption));
    sput(&b, "min_residency = %lluus\n", (unsigned long long)c->min_residency_us);
    sput(&b, "max_preemptions = %u\n", c->max_preemptions);
    sput(&b, "queue_max_requests = %u\n", c->queue_max_requests);
    sput(&b, "queue_max_tokens = %llu\n", (unsigned long long)c->queue_max_tokens);
    sput(&b, "static_batch_size = %u\n", c->static_batch_size);
    sput(&b, "static_batch_timeout = %lluus\n", (unsigned long long)c->static_batch_timeout_us);
    sput(&b, "dynamic_window = %lluus\n", (unsigned long long)c->dynamic_window_us);
    sput(&b, "backpressure_timeout = %lluus\n", (unsigned long long)c->backpressure_timeout_us);
    /* only when set: the policies written before the keys keep their hashes */
    if (c->burst_gather_us) {
        sput(&b, "burst_gather = %lluus\n", (unsigned long long)c->burst_gather_us);
        sput(&b, "burst_gather_max = %lluus\n", (unsigned long long)c->burst_gather_max_us);
    }
    sput(&b, "default_class = %s\n", p->classes[c->default_class].name);
    sput(&b, "default_tenant = %s\n",
         c->default_tenant >= 0 ? p->tenants[c->default_tenant].name : "");
    for (int i = 0; i < p->n_classes; i++) {
        const sched_class_cfg *k = &p->classes[i];
        sput(&b, "\n[class %s]\n", k->name);
        sput(&b, "priority = %d\n", k->priority);
        put_double(&b, "aging_per_s", k->aging_per_s);
        sput(&b, "ttft_target = %lluus\n", (unsigned long long)k->ttft_target_us);
        sput(&b, "tpot_target = %lluus\n", (unsigned long long)k->tpot_target_us);
        sput(&b, "max_queue_wait = %lluus\n", (unsigned long long)k->max_queue_wait_us);
        sput(&b, "latency_sensitive = %s\n", k->latency_sensitive ? "yes" : "no");
        sput(&b, "prefix_order = %s\n", sched_prefix_order_name(k->prefix_order));
        sput(&b, "prefix_max_wait = %lluus\n", (unsigned long long)k->prefix_max_wait_us);
    }
    for (int i = 0; i < p->n_tenants; i++) {
        const sched_tenant_cfg *t = &p->tenants[i];
        sput(&b, "\n[tenant %s]\n", t->name);
        put_double(&b, "weight", t->weight);
        sput(&b, "max_queued_tokens = %llu\n", (unsigned long long)t->max_queued_tokens);
        sput(&b, "max_kv_blocks = %u\n", t->max_kv_blocks);
        put_double(&b, "token_rate_per_s", t->token_rate_per_s);
        sput(&b, "cache_domain = %s\n", t->cache_domain);
        /* only when set: the policies written before the key keep their hashes */
        if (t->cache_per_uid) sput(&b, "cache_per_uid = yes\n");
        sput(&b, "max_cached_blocks = %u\n", t->max_cached_blocks);
        sput(&b, "uids =");
        for (uint32_t u = 0; u < p->n_uids; u++)
            if (p->uids[u].tenant == i) sput(&b, " %u", p->uids[u].uid);
        sput(&b, "\n");
    }
    sput(&b, "\n[trust]\nuids =");
    for (uint32_t u = 0; u < p->n_trusted; u++) sput(&b, " %u", p->trusted[u]);
    sput(&b, "\n");
    if (b.oom || !b.p) {
        free(b.p);
        return -ENOMEM;
    }
    p->canonical = b.p;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const unsigned char *s = (const unsigned char *)b.p; *s; s++) {
        h ^= *s;
        h *= 0x100000001b3ull;
    }
    p->hash = h;
    snprintf(p->hash_hex, sizeof(p->hash_hex), "%016llx", (unsigned long long)h);
    return 0;
}

/* ---- parse ------------------------------------------------------------------------------- */

static int finish(parser *ps)
{
    sched_policy *p = ps->p;
    ps->line = 0;
    if (p->n_classes == 0) default_class(&p->classes[p->n_classes++], "default");
    bool implicit_tenant = p->n_tenants == 0;
    if (implicit_tenant) default_tenant(&p->tenants[p->n_tenants++], "default");

    sched_policy_cfg *c = &p->cfg;
    if (c->burst_gather_us && c->mode != SCHED_MODE_TOKEN_BUDGET) {
        ps->line = ps->gather_line;
        return fail(ps,
                    "burst_gather needs mode = token_budget (static and dynamic gather their "
                    "groups by static_batch_timeout / dynamic_window), mode is %s",
                    sched_mode_name(c->mode));
    }
    if (ps->gather_max_line && !c->burst_gather_us) {
        ps->line = ps->gather_max_line;
        return fail(ps, "burst_gather_max without burst_gather (> 0): nothing is gathered");
    }
    if (c->burst_gather_us && !ps->gather_max_line) c->burst_gather_max_us = 4 * c->burst_gather_us;
    if (c->burst_gather_us && c->burst_gather_max_us < c->burst_gather_us) {
        ps->line = ps->gather_max_line;
        return fail(ps, "burst_gather_max (%lluus) is below burst_gather (%lluus)",
                    (unsigned long long)c->burst_gather_max_us,
                    (unsigned long long)c->burst_gather_us);
    }

    /* the order within each class (before the sort: the key lines are by file order) */
    for (int i = 0; i < p->n_classes; i++) {
        sched_class_cfg *k = &p->classes[i];
        uint64_t mqw = k->max_queue_wait_us;
        if (k->prefix_order == SCHED_PREFIX_ORDER_LONGEST &&
            p->cfg.mode != SCHED_MODE_TOKEN_BUDGET) {
            ps->line = ps->order_line[i];
            return fail(ps,
                        "class \"%s\": prefix_order = longest_prefix needs mode = token_budget "
                        "(the prefix cache runs only there), mode is %s",
                        k->name, sched_mode_name(p->cfg.mode));
        }
        if (!ps->pmw_line[i]) {
            k->prefix_max_wait_us = mqw && mqw / 2 < 1000000 ? mqw / 2 : 1000000;
            if (!k->prefix_max_wait_us) k->prefix_max_wait_us = 1;
        } else if (!k->prefix_max_wait_us) {
            ps->line = ps->pmw_line[i];
            return fail(
                ps,
                "class \"%s\": key \"prefix_max_wait\" must be > 0: it bounds how long a request "
                "can be passed over for one with a longer cached prefix",
                k->name);
        }
        if (k->prefix_order == SCHED_PREFIX_ORDER_LONGEST && mqw && k->prefix_max_wait_us >= mqw) {
            ps->line = ps->pmw_line[i] ? ps->pmw_line[i] : ps->order_line[i];
            return fail(
                ps,
                "class \"%s\": key \"prefix_max_wait\" (%lluus) must be below max_queue_wait "
                "(%lluus), or a passed-over request would time out before its wait bound",
                k->name, (unsigned long long)k->prefix_max_wait_us, (unsigned long long)mqw);
        }
    }
    ps->line = 0;

    /* Sort by name so indices, and the canonical text, do not depend on file order.  uid maps
     * hold tenant indices: remap them through the permutation. */
    char old_names[SCHED_MAX_TENANTS][SCHED_NAME_MAX];
    for (int i = 0; i < p->n_tenants; i++) memcpy(old_names[i], p->tenants[i].name, SCHED_NAME_MAX);
    qsort(p->classes, (size_t)p->n_classes, sizeof(p->classes[0]), cmp_class);
    qsort(p->tenants, (size_t)p->n_tenants, sizeof(p->tenants[0]), cmp_tenant);
    for (uint32_t u = 0; u < p->n_uids; u++)
        p->uids[u].tenant = sched_policy_tenant_index(p, old_names[p->uids[u].tenant]);
    qsort(p->uids, p->n_uids, sizeof(p->uids[0]), cmp_uidmap);
    qsort(p->trusted, p->n_trusted, sizeof(p->trusted[0]), cmp_u32);

    if (ps->default_class_set) {
        int i = sched_policy_class_index(p, ps->default_class);
        if (i < 0) {
            ps->line = ps->default_class_line;
            return fail(ps, "key \"default_class\": no class named \"%s\"", ps->default_class);
        }
        p->cfg.default_class = i;
    } else {
        int i = sched_policy_class_index(p, "default");
        p->cfg.default_class = i >= 0 ? i : 0;
    }
    if (ps->default_tenant_set && ps->default_tenant[0]) {
        int i = sched_policy_tenant_index(p, ps->default_tenant);
        if (i < 0) {
            ps->line = ps->default_tenant_line;
            return fail(ps, "key \"default_tenant\": no tenant named \"%s\"", ps->default_tenant);
        }
        p->cfg.default_tenant = i;
    } else if (!ps->default_tenant_set) {
        /* implicit "default" tenant, or one the file named "default" */
        p->cfg.default_tenant = implicit_tenant ? 0 : sched_policy_tenant_index(p, "default");
        if (p->cfg.default_tenant < 0) p->cfg.default_tenant = -1;
    } else {
        p->cfg.default_tenant = -1; /* "default_tenant =" : refuse unmapped uids */
    }
    if (p->cfg.mode == SCHED_MODE_TOKEN_BUDGET &&
        p->cfg.decode_reserve_tokens >= p->cfg.token_budget)
        return fail(ps,
                    "decode_reserve_tokens (%u) must be below token_budget (%u), or prefill "
                    "could never run while latency-sensitive sequences decode",
                    p->cfg.decode_reserve_tokens, p->cfg.token_budget);
    return build_canonical(p);
}

int sched_policy_parse(const char *text, sched_policy **out, sched_policy_error *err)
{
    if (err) {
        err->line = 0;
        err->reason[0] = 0;
    }
    if (!out) {
        sched__set_error("sched_policy_parse: out is NULL");
        return -EINVAL;
    }
    *out = NULL;
    if (!text) text = "";
    sched_policy *p = calloc(1, sizeof(*p));
    if (!p) {
        sched__set_error("policy: out of memory");
        return -ENOMEM;
    }
    default_cfg(&p->cfg);
    parser ps = {.p = p, .err = err};
    int rc = 0;
    const char *c = text;
    if ((unsigned char)c[0] == 0xEF && (unsigned char)c[1] == 0xBB && (unsigned char)c[2] == 0xBF)
        c += 3;                          /* UTF-8 byte-order mark from some editors */
    static __thread char linebuf[16384]; /* a uid list can be long */
    while (*c && !rc) {
        size_t n = strcspn(c, "\n");
        ps.line++;
        if (n >= sizeof(linebuf)) {
            rc = fail(&ps, "line longer than %zu bytes", sizeof(linebuf) - 1);
            break;
        }
        memcpy(linebuf, c, n);
        linebuf[n] = 0;
        c += n + (c[n] == '\n');
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)linebuf[i] < 0x20 && linebuf[i] != '\t' && linebuf[i] != '\r') {
                rc = fail(&ps, "control character 0x%02x in text", (unsigned char)linebuf[i]);
                break;
            }
        if (rc) break;
        /* comments: '#' or ';' at the start or after whitespace */
        for (size_t i = 0; i < n; i++)
            if ((linebuf[i] == '#' || linebuf[i] == ';') &&
                (i == 0 || linebuf[i - 1] == ' ' || linebuf[i - 1] == '\t')) {
                linebuf[i] = 0;
                break;
            }
        char *l = trim(linebuf);
        if (!*l) continue;
        if (*l == '[') {
            char *e = strchr(l, ']');
            if (!e || e[1]) {
                rc = fail(&ps, "section header must look like [name] with nothing after it");
                break;
            }
            *e = 0;
            rc = open_section(&ps, l + 1);
            continue;
        }
        char *eq = strchr(l, '=');
        if (!eq) {
            rc = fail(&ps, "expected key = value, got \"%.60s\"", l);
            break;
        }
        *eq = 0;
        char *key = trim(l), *val = trim(eq + 1);
        if (!*key) {
            rc = fail(&ps, "missing key before '='");
            break;
        }
        rc = set_key(&ps, key, val);
    }
    if (!rc) rc = finish(&ps);
    if (rc) {
        sched_policy_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void sched_policy_free(sched_policy *p)
{
    if (!p) return;
    free(p->canonical);
    free(p);
}

/* ---- accessors ----------------------------------------------------------------------------- */

const sched_policy_cfg *sched_policy_get(const sched_policy *p)
{
    return p ? &p->cfg : NULL;
}
int sched_policy_n_classes(const sched_policy *p)
{
    return p ? p->n_classes : 0;
}
int sched_policy_n_tenants(const sched_policy *p)
{
    return p ? p->n_tenants : 0;
}
const sched_class_cfg *sched_policy_class(const sched_policy *p, int i)
{
    return p && i >= 0 && i < p->n_classes ? &p->classes[i] : NULL;
}
const sched_tenant_cfg *sched_policy_tenant(const sched_policy *p, int i)
{
    return p && i >= 0 && i < p->n_tenants ? &p->tenants[i] : NULL;
}

int sched_policy_class_index(const sched_policy *p, const char *name)
{
    if (!p) return -EINVAL;
    if (!name) return p->cfg.default_class;
    for (int i = 0; i < p->n_classes; i++)
        if (!strcmp(p->classes[i].name, name)) return i;
    return -ENOENT;
}

int sched_policy_tenant_index(const sched_policy *p, const char *name)
{
    if (!p) return -EINVAL;
    if (!name) return p->cfg.default_tenant >= 0 ? p->cfg.default_tenant : -ENOENT;
    for (int i = 0; i < p->n_tenants; i++)
        if (!strcmp(p->tenants[i].name, name)) return i;
    return -ENOENT;
}

int sched_policy_tenant_for_uid(const sched_policy *p, uint32_t uid)
{
    if (!p) return -EINVAL;
    size_t lo = 0, hi = p->n_uids;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->uids[mid].uid < uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < p->n_uids && p->uids[lo].uid == uid) return p->uids[lo].tenant;
    return p->cfg.default_tenant >= 0 ? p->cfg.default_tenant : -ENOENT;
}

bool sched_policy_uid_trusted(const sched_policy *p, uint32_t uid)
{
    if (!p) return false;
    return bsearch(&uid, p->trusted, p->n_trusted, sizeof(uint32_t), cmp_u32) != NULL;
}

uint32_t sched_policy_trusted_uids(const sched_policy *p, const uint32_t **uids)
{
    *uids = p ? p->trusted : NULL;
    return p ? p->n_trusted : 0;
}

uint64_t sched_policy_cache_salt(const sched_policy *p, int tenant)
{
    if (!p || tenant < 0 || tenant >= p->n_tenants) return 0;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 of "domain:" NAME */
    static const char tag[] = "domain:";
    for (const char *c = tag; *c; c++) {
        h ^= (unsigned char)*c;
        h *= 0x100000001b3ull;
    }
    for (const char *c = p->tenants[tenant].cache_domain; *c; c++) {
        h ^= (unsigned char)*c;
        h *= 0x100000001b3ull;
    }
    return h ? h : 1;
}

uint64_t sched_policy_cache_salt_uid(const sched_policy *p, int tenant, uint32_t uid)
{
    uint64_t h = sched_policy_cache_salt(p, tenant);
    if (!h || !p->tenants[tenant].cache_per_uid) return h;
    static const char tag[] = "uid:"; /* FNV-1a 64 continued over "uid:" and the uid's bytes */
    for (const char *c = tag; *c; c++) {
        h ^= (unsigned char)*c;
        h *= 0x100000001b3ull;
    }
    for (int i = 0; i < 4; i++) {
        h ^= (uid >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h ? h : 1;
}

const char *sched_policy_canonical(const sched_policy *p)
{
    return p ? p->canonical : NULL;
}
uint64_t sched_policy_hash(const sched_policy *p)
{
    return p ? p->hash : 0;
}
const char *sched_policy_hash_hex(const sched_policy *p)
{
    return p ? p->hash_hex : NULL;
}

/* Internal: a deep copy for the scheduler (policies are immutable, but the caller may free
 * theirs). */
sched_policy *sched__policy_clone(const sched_policy *p);
sched_policy *sched__policy_clone(const sched_policy *p)
{
    sched_policy *q = malloc(sizeof(*q));
    if (!q) return NULL;
    memcpy(q, p, sizeof(*q));
    q->canonical = strdup(p->canonical);
    if (!q->canonical) {
        free(q);
        return NULL;
    }
    return q;
}
