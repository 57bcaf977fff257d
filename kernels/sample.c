/* SPDX-License-Identifier: MIT */
/*
 * kernels/sample.c — token sampling: greedy, temperature, top-k, top-p, from a per-request
 * rng state. Deterministic: equal logits, settings and rng state give the same token on
 * every machine (ties are broken by the lower token id; sums are in double).
 */
#include "kernels/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

uint64_t eng_rng_init(uint64_t seed)
{
    uint64_t s = eng_splitmix64(seed);
    return s ? s : 0x9e3779b97f4a7c15ull; /* xorshift must never hold 0 */
}

/* xorshift64* (Vigna); a uniform float in [0, 1) from its top 24 bits. */
static float rng_uniform(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

typedef struct cand {
    float prob;
    int32_t id;
} cand;

/* Descending probability, then ascending id: a total order, so qsort is deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->prob != y->prob)
        return x->prob < y->prob ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Min-heap on (prob, -id) keeps the k best candidates in O(vocab log k). */
static bool worse(const cand *a, const cand *b)
{
    return a->prob < b->prob || (a->prob == b->prob && a->id > b->id);
}

static void heap_sift_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(&h[l], &h[m]))
            m = l;
        if (r < n && worse(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Per-thread candidate buffer, kept between calls: a vocabulary's worth is above malloc's
 * mmap threshold, and a fresh mapping per sampled token costs page faults every step. */
typedef struct cand_buf {
    size_t n;
    cand c[];
} cand_buf;

static pthread_key_t cand_key;
static pthread_once_t cand_once = PTHREAD_ONCE_INIT;

static void cand_key_init(void) { pthread_key_create(&cand_key, free); }

static cand *cand_scratch(int vocab)
{
    pthread_once(&cand_once, cand_key_init);
    cand_buf *b = pthread_getspecific(cand_key);
    if (b && b->n >= (size_t)vocab)
        return b->c;
    free(b);
    b = malloc(sizeof *b + (size_t)vocab * sizeof(cand));
    if (b)
        b->n = (size_t)vocab;
    pthread_setspecific(cand_key, b);
    return b ? b->c : NULL;
}

int32_t eng_sample(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng)
{
    if (vocab <= 0)
        return 0;
    if (!s || s->temperature <= 0.0f || !(s->temperature == s->temperature))
        return argmax(logits, vocab);
    /* Always draw once per sampled token, so a request's stream of draws does not depend on
     * which truncation path was taken. */
    float coin = rng_uniform(rng);
    cand *c = cand_scratch(vocab);
    if (!c)
        return argmax(logits, vocab); /* out of memory: the most likely token beats failing */
    float max = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++) {
        c[i].prob = expf((logits[i] - max) / s->temperature);
        c[i].id = i;
        sum += c[i].prob;
    }
    int n = vocab;
    bool sorted = false;
    if (s->top_k > 0 && s->top_k < vocab) {
        int k = s->top_k;
        for (int i = k / 2 - 1; i >= 0; i--)
            heap_sift_down(c, k, i);
        for (int i = k; i < vocab; i++) {
            if (worse(&c[0], &c[i])) {
                c[0] = c[i];
                heap_sift_down(c, k, 0);
            }
        }
        n = k;
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        sorted = true;
        sum = 0;
        for (int i = 0; i < n; i++)
            sum += c[i].prob;
    }
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        if (!sorted) {
            /* As llama2.c: tokens below (1-p)/(n-1) of the mass can never be in the nucleus,
             * so only the rest is sorted. */
            double cutoff = (1.0 - s->top_p) / (double)(n - 1 > 0 ? n - 1 : 1) * sum;
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].prob >= cutoff)
                    c[m++] = c[i];
            n = m > 0 ? m : 1;
            qsort(c, (size_t)n, sizeof *c, cand_cmp);
        }
        double total = sum, acc = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += c[i].prob;
            if (acc > s->top_p * total) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++)
            sum += c[i].prob;
    }
    double r = (double)coin * sum, acc = 0;
    int32_t pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].prob;
        if (r < acc) {
            pick = c[i].id;
            break;
        }
    }
    return pick;
}
