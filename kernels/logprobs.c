/* SPDX-License-Identifier: MIT */
/*
 * kernels/logprobs.c — log-probabilities of a row of logits (engine.h): log-softmax at one
 * token, its rank, and the top n of the vocabulary; and the processed distribution that
 * eng_sample draws from, as logits.
 *
 * Two passes over a row, whatever n is: the maximum (eng_argmax's vector path), then one
 * pass that sums exp(l - max), counts the tokens above the target and keeps the top n in a
 * min-heap behind a threshold (after the heap fills, almost every logit loses one compare
 * against its smallest member, so the pass costs what the exp-sum costs). The exp is a
 * vector polynomial on AVX2 (relative error ~2e-7, so a log-probability is off by less
 * than 1e-6), the libm one elsewhere; the sum is in double on the portable path and in
 * eight float lanes, added in double at the end, on AVX2.
 */
#include "kernels/engine.h"
#include "kernels/logits.h"
#include "kernels/sample.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LP_HAVE_X86 1
#else
#define LP_HAVE_X86 0
#endif

/* ---- the top n: a min-heap on (logit, -id) ------------------------------------------- */

typedef struct top_heap {
    int n, cap;
    float v[ENG_TOP_LOGPROBS_MAX];
    int32_t id[ENG_TOP_LOGPROBS_MAX];
} top_heap;

/* a is worse than b: lower logit, or equal and a higher id */
static int heap_worse(const top_heap *h, int a, int b)
{
    return h->v[a] < h->v[b] || (h->v[a] == h->v[b] && h->id[a] > h->id[b]);
}

static void heap_swap(top_heap *h, int a, int b)
{
    float tv = h->v[a];
    int32_t ti = h->id[a];
    h->v[a] = h->v[b];
    h->id[a] = h->id[b];
    h->v[b] = tv;
    h->id[b] = ti;
}

static void heap_down(top_heap *h, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && heap_worse(h, l, m)) m = l;
        if (r < h->n && heap_worse(h, r, m)) m = r;
        if (m == i) return;
        heap_swap(h, i, m);
        i = m;
    }
}

/* Offers logit x of token id (ids come in ascending order, so an equal logit never
 * displaces an earlier token). */
static void heap_offer(top_heap *h, float x, int32_t id)
{
    if (!(x > -INFINITY)) return; /* -inf and NaN are never listed */
    if (h->n < h->cap) {
        int i = h->n++;
        h->v[i] = x;
        h->id[i] = id;
        while (i > 0) {
            int p = (i - 1) / 2;
            if (!heap_worse(h, i, p)) break;
            heap_swap(h, i, p);
            i = p;
        }
        return;
    }
    if (!(x > h->v[0])) return;
    h->v[0] = x;
    h->id[0] = id;
    heap_down(h, 0);
}

/* The threshold a logit must beat to enter: -inf until the heap is full. */
static float heap_floor(const top_heap *h)
{
    return h->n < h->cap ? -INFINITY : h->v[0];
}

/* ---- the pass: exp-sum, rank, top n ---------------------------------------------------- */

typedef struct row_pass {
    double sum;       /* sum of exp(l - max) */
    uint32_t greater; /* logits strictly above the target's */
} row_pass;

static void pass_portable(const float *v, int n, float max, float tv, top_heap *h, row_pass *out)
{
    double sum = 0;
    uint32_t greater = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] > -INFINITY) sum += exp((double)(v[i] - max));
        greater += v[i] > tv;
        if (h->cap && v[i] > heap_floor(h)) heap_offer(h, v[i], i);
    }
    out->sum = sum;
    out->greater = greater;
}

#if LP_HAVE_X86
#define AVX2 __attribute__((target("avx2,fma")))

/* exp(x) for x <= 0 (x - max): Cephes' range reduction and degree-5 polynomial, as in
 * the well-known avx_mathfun. Inputs below -87.3 give 0 (the float would be denormal or
 * zero anyway), -inf gives 0, NaN gives NaN. */
AVX2 static inline __attribute__((always_inline)) __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo); /* a NaN becomes lo: it adds ~0 to the sum */
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    __m256 z = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
    __m256 pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
    return _mm256_andnot_ps(below, _mm256_mul_ps(y, pow2n));
}

AVX2 static void pass_avx2(const float *v, int n, float max, float tv, top_heap *h, row_pass *out)
{
    const __m256 vmax = _mm256_set1_ps(max), vt = _mm256_set1_ps(tv);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256i cnt = _mm256_setzero_si256();
    double sum = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + 8);
        acc0 = _mm256_add_ps(acc0, exp256(_mm256_sub_ps(a, vmax)));
        acc1 = _mm256_add_ps(acc1, exp256(_mm256_sub_ps(b, vmax)));
        /* a true compare is all ones: subtracting it counts one */
        cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(a, vt, _CMP_GT_OQ)));
        cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(b, vt, _CMP_GT_OQ)));
        if (h->cap) {
            const __m256 fl = _mm256_set1_ps(heap_floor(h));
            int m = _mm256_movemask_ps(_mm256_cmp_ps(a, fl, _CMP_GT_OQ)) |
                    _mm256_movemask_ps(_mm256_cmp_ps(b, fl, _CMP_GT_OQ)) << 8;
            while (m) {
                int j = i + __builtin_ctz((unsigned)m);
                m &= m - 1;
                heap_offer(h, v[j], j);
            }
        }
        /* flush the float lanes now and then: 16 lanes of at most 1 each stay exact */
        if ((i & 4095) == 4080) {
            float lanes[8];
            _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1));
            for (int k = 0; k < 8; k++) sum += lanes[k];
            acc0 = acc1 = _mm256_setzero_ps();
        }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1));
    for (int k = 0; k < 8; k++) sum += lanes[k];
    int32_t c[8];
    _mm256_storeu_si256((__m256i *)c, cnt);
    uint32_t greater = 0;
    for (int k = 0; k < 8; k++) greater += (uint32_t)c[k];
    for (; i < n; i++) {
        if (v[i] > -INFINITY) sum += exp((double)(v[i] - max));
        greater += v[i] > tv;
        if (h->cap && v[i] > heap_floor(h)) heap_offer(h, v[i], i);
    }
    out->sum = sum;
    out->greater = greater;
}
#endif

int eng_logprobs_row(const float *logits, int vocab, int32_t target, int top_n, eng_logprobs *out)
{
    if (vocab < 1 || top_n < 0 || top_n > ENG_TOP_LOGPROBS_MAX || target >= vocab || !out)
        return eng_seterr(-EINVAL, "logprobs: vocab %d, top_n %d (0..%d), target %d", vocab, top_n,
                          ENG_TOP_LOGPROBS_MAX, target);
    float max = logits[eng_argmax(ENG_ARGMAX_AUTO, logits, vocab)];
    float tv = target >= 0 ? logits[target] : INFINITY;
    top_heap h = {.cap = top_n};
    row_pass p;
    if (!(max > -INFINITY) || !(max < INFINITY)) {
        /* nothing finite to normalise (all -inf or NaN, or an +inf logit): every listed
         * token gets NaN rather than a number that pretends */
        pass_portable(logits, vocab, 0.0f, tv, &h, &p);
        p.sum = NAN;
    } else {
#if LP_HAVE_X86
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            pass_avx2(logits, vocab, max, tv, &h, &p);
        else
#endif
            pass_portable(logits, vocab, max, tv, &h, &p);
    }
    double lse = (double)max + log(p.sum);
    out->token = target;
    out->logprob = target >= 0 ? (float)((double)tv - lse) : NAN;
    out->rank = target >= 0 ? p.greater + 1 : 0;
    /* the heap, best first */
    int n = h.n;
    out->n_top = n;
    for (int k = n - 1; k >= 0; k--) {
        out->top_id[k] = h.id[0];
        out->top_logprob[k] = (float)((double)h.v[0] - lse);
        h.v[0] = h.v[h.n - 1];
        h.id[0] = h.id[h.n - 1];
        h.n--;
        heap_down(&h, 0);
    }
    return 0;
}

/* ---- the processed distribution -------------------------------------------------------- */

typedef struct lp_cand {
    float v;
    int32_t id;
} lp_cand;

/* descending logit, then ascending id: eng_sample's order */
static int lp_cand_cmp(const void *a, const void *b)
{
    const lp_cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

void eng_logits_processed(const float *logits, int vocab, const eng_sampling *s, float *out)
{
    memcpy(out, logits, (size_t)vocab * sizeof *out);
    /* the request's processors (bias, penalties, constraint) on the copy: eng_sample has
     * restored the row itself; the copy is never restored, its stash is scratch */
    if (s && s->proc && eng_lp_apply(s->proc, out, vocab) < 0) return;
    const bool greedy = !s || !(s->temperature > 0.0f);
    const float inv_t = greedy ? 1.0f : 1.0f / s->temperature;
    if (!greedy)
        for (int i = 0; i < vocab; i++) out[i] *= inv_t;
    if (greedy) return; /* greedy draws from nothing: the logits as they are (vLLM) */
    const float min_p = s->proc ? eng_lp_min_p(s->proc) : 0.0f;
    const bool top_k = s->top_k > 0 && s->top_k < vocab;
    const bool top_p = s->top_p > 0.0f && s->top_p < 1.0f;
    if (min_p > 0.0f) {
        /* p < min_p * p_max, as eng_sample: exp(l - max) < min_p */
        float max = out[eng_argmax(ENG_ARGMAX_AUTO, out, vocab)];
        for (int i = 0; i < vocab; i++)
            if (expf(out[i] - max) < min_p) out[i] = -INFINITY;
    }
    if (!top_k && !top_p) return;
    lp_cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) return; /* out of memory: the untruncated distribution rather than none */
    for (int i = 0; i < vocab; i++) c[i] = (lp_cand){out[i], i};
    qsort(c, (size_t)vocab, sizeof *c, lp_cand_cmp);
    int keep = top_k ? s->top_k : vocab;
    if (top_p) {
        /* the nucleus as eng_sample takes it: the shortest prefix whose mass exceeds p */
        double total = 0, acc = 0;
        for (int i = 0; i < keep; i++) total += exp((double)(c[i].v - c[0].v));
        for (int i = 0; i < keep; i++) {
            acc += exp((double)(c[i].v - c[0].v));
            if (acc > s->top_p * total) {
                keep = i + 1;
                break;
            }
        }
    }
    for (int i = keep; i < vocab; i++) out[c[i].id] = -INFINITY;
    free(c);
}
