/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_reason.c — reasoning_content split off an answer (see gw_reason.h). The whole
 * split follows vLLM's parsers of the same names; the streamed one reaches the same pieces
 * by holding back at most the bytes that may still become a tag.
 */
#include "gateway/gw_reason.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
#define OPEN_N  (sizeof OPEN - 1)
#define CLOSE_N (sizeof CLOSE - 1)

int gw_reason_by_name(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "deepseek_r1")) return GW_REASON_DEEPSEEK_R1;
    if (!strcmp(name, "qwen3")) return GW_REASON_QWEN3;
    return -1;
}

static const char *find(const char *t, size_t n, const char *tag, size_t tn)
{
    return n >= tn ? memmem(t, n, tag, tn) : NULL;
}

void gw_reason_split(int parser, const char *t, size_t n, const char **r, size_t *rn,
                     const char **c, size_t *cn)
{
    *r = *c = NULL;
    *rn = *cn = 0;
    const char *open = find(t, n, OPEN, OPEN_N), *close = find(t, n, CLOSE, CLOSE_N);
    if (parser == GW_REASON_NONE || (parser == GW_REASON_QWEN3 && (!open || !close))) {
        if (n) *c = t, *cn = n;
        return;
    }
    /* what follows the first <think>, else the whole text */
    const char *s = open ? open + OPEN_N : t, *end = t + n;
    close = find(s, (size_t)(end - s), CLOSE, CLOSE_N);
    if (!close) {
        *r = s;
        *rn = (size_t)(end - s);
        return;
    }
    *r = s;
    *rn = (size_t)(close - s);
    if (close + CLOSE_N < end) {
        *c = close + CLOSE_N;
        *cn = (size_t)(end - *c);
    }
}

/* The longest tail of t[0..n) that begins tag (shorter than it): bytes to hold back. */
static size_t tag_prefix_tail(const char *t, size_t n, const char *tag, size_t tn)
{
    for (size_t k = tn - 1 < n ? tn - 1 : n; k > 0; k--)
        if (!memcmp(t + n - k, tag, k)) return k;
    return 0;
}

/* The streamed split. The whole split's rules, as the text arrives: deepseek_r1 is in the
 * reasoning from the start and drops a <think> that opens the text; qwen3 waits for the
 * text to open with <think> (reasoning) or not (content: then all of it is). Of a text
 * that opens with something else and only later says <think>, deepseek_r1 keeps what came
 * first as reasoning, as the whole split (which drops it) cannot stream; qwen3 decides at
 * the start, where vLLM's streaming parser decides too. */
int gw_reason_feed(gw_reason_state *st, const char *t, size_t n, bool final,
                   int (*emit)(void *arg, bool reasoning, const char *t, size_t n), void *arg)
{
    char buf[sizeof st->hold + 256];
    int rc;
    for (;;) {
        size_t take = n < sizeof buf - st->n_hold ? n : sizeof buf - st->n_hold;
        bool last = final && take == n; /* the rest of the answer is in buf */
        if (!take && (!last || !st->n_hold)) return 0;
        memcpy(buf, st->hold, st->n_hold);
        memcpy(buf + st->n_hold, t, take);
        size_t bn = st->n_hold + take;
        t += take;
        n -= take;
        st->n_hold = 0;
        const char *p = buf;
        if (st->phase == 0) {
            if (bn >= OPEN_N && !memcmp(p, OPEN, OPEN_N)) {
                p += OPEN_N;
                bn -= OPEN_N;
                st->phase = 1;
            } else if (bn < OPEN_N && !memcmp(p, OPEN, bn) && !last) {
                memcpy(st->hold, p, bn); /* it may still open with <think> */
                st->n_hold = bn;
                continue;
            } else {
                st->phase = st->parser == GW_REASON_DEEPSEEK_R1 ? 1 : 2;
            }
        }
        if (st->phase == 1) {
            const char *close = find(p, bn, CLOSE, CLOSE_N);
            if (close) {
                if (close > p && (rc = emit(arg, true, p, (size_t)(close - p)))) return rc;
                st->phase = 2;
                bn -= (size_t)(close - p) + CLOSE_N;
                p = close + CLOSE_N;
            } else {
                size_t keep = last ? 0 : tag_prefix_tail(p, bn, CLOSE, CLOSE_N);
                if (bn > keep && (rc = emit(arg, true, p, bn - keep))) return rc;
                memcpy(st->hold, p + bn - keep, keep);
                st->n_hold = keep;
                bn = 0;
            }
        }
        if (st->phase == 2 && bn && (rc = emit(arg, false, p, bn))) return rc;
        if (last) return 0;
    }
}
