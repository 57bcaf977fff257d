/* SPDX-License-Identifier: MIT */
/*
 * kernels/sample.c — token sampling: greedy, temperature, top-k, top-p, from a per-request
 * rng state. Deterministic: equal logits, settings and rng state give the same token on
 * every machine (ties are broken by the lower token id; sums are in double).
 */
#include "kernels/sample.h"
#include "kernels/engine.h"
#include "kernels/logits.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SAMPLE_HAVE_X86 1
#else
#define SAMPLE_HAVE_X86 0
#endif

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

/* ---- argmax (sample.h) ------------------------------------------------------------------
 *
 * The scalar loop is the definition; the vector paths compute the same index in two passes:
 * M, the largest value that is not NaN (MAXPS returns its second operand when either is
 * NaN, and the accumulators start at v[0], so a NaN never enters them), then the first i
 * with v[i] == M (an ordered compare: NaN never equals). Both read the logits row from
 * cache, just written by the classifier: ~2 µs for 32,000 floats where the scalar loop,
 * one dependent compare per element, took ~80. */

static int32_t argmax_portable(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

#if SAMPLE_HAVE_X86
#define AVX2   __attribute__((target("avx2")))
#define AVX512 __attribute__((target("avx512f,avx2")))

/* The first i in [from, n) with v[i] == m, scalar: the tails of the vector passes. */
static int32_t first_equal_tail(const float *v, int from, int n, float m)
{
    for (int i = from; i < n; i++)
        if (v[i] == m) return i;
    return -1;
}

AVX2 static int32_t argmax_avx2(const float *v, int n)
{
    __m256 m0 = _mm256_set1_ps(v[0]), m1 = m0, m2 = m0, m3 = m0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(v + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(v + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(v + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(v + i + 24), m3);
    }
    for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(v + i), m0);
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float m = _mm_cvtss_f32(h);
    for (; i < n; i++)
        if (v[i] > m) m = v[i];
    const __m256 vm = _mm256_set1_ps(m);
    for (i = 0; i + 32 <= n; i += 32) {
        const __m256 e0 = _mm256_cmp_ps(_mm256_loadu_ps(v + i), vm, _CMP_EQ_OQ);
        const __m256 e1 = _mm256_cmp_ps(_mm256_loadu_ps(v + i + 8), vm, _CMP_EQ_OQ);
        const __m256 e2 = _mm256_cmp_ps(_mm256_loadu_ps(v + i + 16), vm, _CMP_EQ_OQ);
        const __m256 e3 = _mm256_cmp_ps(_mm256_loadu_ps(v + i + 24), vm, _CMP_EQ_OQ);
        const __m256 any = _mm256_or_ps(_mm256_or_ps(e0, e1), _mm256_or_ps(e2, e3));
        if (_mm256_movemask_ps(any)) {
            const uint32_t bits =
                (uint32_t)_mm256_movemask_ps(e0) | (uint32_t)_mm256_movemask_ps(e1) << 8 |
                (uint32_t)_mm256_movemask_ps(e2) << 16 | (uint32_t)_mm256_movemask_ps(e3) << 24;
            return i + __builtin_ctz(bits);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), vm, _CMP_EQ_OQ));
        if (bits) return i + __builtin_ctz((unsigned)bits);
    }
    return first_equal_tail(v, i, n, m);
}

AVX512 static int32_t argmax_avx512(const float *v, int n)
{
    __m512 m0 = _mm512_set1_ps(v[0]), m1 = m0, m2 = m0, m3 = m0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(_mm512_loadu_ps(v + i), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(v + i + 16), m1);
        m2 = _mm512_max_ps(_mm512_loadu_ps(v + i + 32), m2);
        m3 = _mm512_max_ps(_mm512_loadu_ps(v + i + 48), m3);
    }
    for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(_mm512_loadu_ps(v + i), m0);
    m0 = _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3));
    float m = _mm512_reduce_max_ps(m0);
    for (; i < n; i++)
        if (v[i] > m) m = v[i];
    const __m512 vm = _mm512_set1_ps(m);
    for (i = 0; i + 64 <= n; i += 64) {
        const __mmask16 e0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), vm, _CMP_EQ_OQ);
        const __mmask16 e1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i + 16), vm, _CMP_EQ_OQ);
        const __mmask16 e2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i + 32), vm, _CMP_EQ_OQ);
        const __mmask16 e3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i + 48), vm, _CMP_EQ_OQ);
        const uint64_t bits =
            (uint64_t)e0 | (uint64_t)e1 << 16 | (uint64_t)e2 << 32 | (uint64_t)e3 << 48;
        if (bits) return i + __builtin_ctzll(bits);
    }
    for (; i + 16 <= n; i += 16) {
        const __mmask16 e = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), vm, _CMP_EQ_OQ);
        if (e) return i + __builtin_ctz((unsigned)e);
    }
    return first_equal_tail(v, i, n, m);
}
#endif

bool eng_argmax_supported(eng_argmax_path path)
{
    switch (path) {
    case ENG_ARGMAX_AUTO:
    case ENG_ARGMAX_PORTABLE: return true;
#if SAMPLE_HAVE_X86
    case ENG_ARGMAX_AVX2: return __builtin_cpu_supports("avx2");
    case ENG_ARGMAX_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2");
#else
    case ENG_ARGMAX_AVX2:
    case ENG_ARGMAX_AVX512: return false;
#endif
    }
    return false;
}

eng_argmax_path eng_argmax_auto_path(void)
{
    /* Resolved once; a benign race (every thread computes the same answer). */
    static _Atomic int resolved = -1;
    int p = resolved;
    if (p < 0) {
        p = eng_argmax_supported(ENG_ARGMAX_AVX512) ? ENG_ARGMAX_AVX512
            : eng_argmax_supported(ENG_ARGMAX_AVX2) ? ENG_ARGMAX_AVX2
                                                    : ENG_ARGMAX_PORTABLE;
        resolved = p;
    }
    return (eng_argmax_path)p;
}

int32_t eng_argmax(eng_argmax_path path, const float *v, int n)
{
    if (n <= 1 || v[0] != v[0]) /* NaN first: the loop never leaves index 0 */
        return 0;
    if (path == ENG_ARGMAX_AUTO) path = eng_argmax_auto_path();
#if SAMPLE_HAVE_X86
    if (path == ENG_ARGMAX_AVX512 && eng_argmax_supported(ENG_ARGMAX_AVX512))
        return argmax_avx512(v, n);
    if (path == ENG_ARGMAX_AVX2 && eng_argmax_supported(ENG_ARGMAX_AVX2)) return argmax_avx2(v, n);
#endif
    return argmax_portable(v, n);
}

static int32_t argmax(const float *v, int n)
{
    return eng_argmax(ENG_ARGMAX_AUTO, v, n);
}

typedef struct cand {
    float prob;
    int32_t id;
} cand;

/* Descending probability, then ascending id: a total order, so qsort is deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->prob != y->prob) return x->prob < y->prob ? 1 : -1;
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
        if (l < n && worse(&h[l], &h[m])) m = l;
        if (r < n && worse(&h[r], &h[m])) m = r;
        if (m == i) return;
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

static void cand_key_init(void)
{
    pthread_key_create(&cand_key, free);
}

static cand *cand_scratch(int vocab)
{
    pthread_once(&cand_once, cand_key_init);
    cand_buf *b = pthread_getspecific(cand_key);
    if (b && b->n >= (size_t)vocab) return b->c;
    free(b);
    b = malloc(sizeof *b + (size_t)vocab * sizeof(cand));
    if (b) b->n = (size_t)vocab;
    pthread_setspecific(cand_key, b);
    return b ? b->c : NULL;
}

static int32_t sample_row(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng,
                          float min_p);

int32_t eng_sample(float *logits, int vocab, const eng_sampling *s, uint64_t *rng)
{
    if (vocab <= 0) return 0;
    if (!s || !s->proc) return sample_row(logits, vocab, s, rng, 0.0f);
    if (eng_lp_apply(s->proc, logits, vocab) < 0) return -1;
    int32_t pick = sample_row(logits, vocab, s, rng, eng_lp_min_p(s->proc));
    eng_lp_restore(s->proc, logits, vocab, pick);
    return pick;
}

/* Temperature → top-k → top-p → min-p → the draw, on the processed row. */
static int32_t sample_row(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng,
                          float min_p)
{
    if (!s || s->temperature <= 0.0f || !(s->temperature == s->temperature))
        return argmax(logits, vocab);
    /* Always draw once per sampled token, so a request's stream of draws does not depend on
     * which truncation path was taken. */
    float coin = rng_uniform(rng);
    cand *c = cand_scratch(vocab);
    if (!c) return argmax(logits, vocab); /* out of memory: the most likely token beats failing */
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
        for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
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
        for (int i = 0; i < n; i++) sum += c[i].prob;
    }
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        if (!sorted) {
            /* As llama2.c: tokens below (1-p)/(n-1) of the mass can never be in the nucleus,
             * so only the rest is sorted. */
            double cutoff = (1.0 - s->top_p) / (double)(n - 1 > 0 ? n - 1 : 1) * sum;
            int m = 0;
            for (int i = 0; i < n; i++)
                if (c[i].prob >= cutoff) c[m++] = c[i];
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
        for (int i = 0; i < n; i++) sum += c[i].prob;
    }
    if (min_p > 0.0f) {
        /* The most likely token's weight is exp(0) = 1 and it survives top-k and top-p, so
         * "p < min_p * p_max" is "weight < min_p"; the order of c is kept. */
        int m = 0;
        sum = 0;
        for (int i = 0; i < n; i++)
            if (c[i].prob >= min_p) {
                c[m++] = c[i];
                sum += c[i].prob;
            }
        n = m > 0 ? m : 1;
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
