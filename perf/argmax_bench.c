/* SPDX-License-Identifier: MIT */
/*
 * argmax_bench — greedy sampling's argmax (kernels/sample.h) per path, on a row of logits
 * of a model's vocabulary size already in cache (as the classifier leaves it): the time
 * of one call, median over --repeats of the mean of --calls calls, with the spread
 * (lowest, highest). The portable path is the scalar loop the engine used before; the
 * others must give its answer (checked on every row).
 *
 *   argmax_bench [--vocab 32000] [--repeats 15] [--calls 200]
 */
#include "kernels/sample.h"
#include "perf/bench_util.h"

#include <getopt.h>

int main(int argc, char **argv)
{
    int vocab = 32000, repeats = 15, calls = 200;
    static const struct option lo[] = {{"vocab", required_argument, 0, 'v'},
                                       {"repeats", required_argument, 0, 'r'},
                                       {"calls", required_argument, 0, 'c'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'v': vocab = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'c': calls = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: argmax_bench [--vocab 32000] [--repeats 15] [--calls 200]\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (vocab < 1 || repeats < 1 || repeats > 1000 || calls < 1) {
        fprintf(stderr, "argmax_bench: bad arguments\n");
        return 2;
    }
    float *v = malloc((size_t)vocab * sizeof(float));
    if (!v) return 1;
    /* logits-like values: the maximum somewhere in the last third (a scan stops at it) */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < vocab; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = (float)(s >> 40) / 16777216.0f * 20.0f - 10.0f;
    }
    const int top = vocab - 1 - vocab / 3;
    v[top] = 50.0f;
    static const eng_argmax_path paths[] = {ENG_ARGMAX_PORTABLE, ENG_ARGMAX_AVX2, ENG_ARGMAX_AVX512,
                                            ENG_ARGMAX_AUTO};
    static const char *const names[] = {"portable (scalar)", "avx2", "avx512", "auto"};
    printf("argmax over %d floats in cache, us per call: median [lowest, highest] of %d repeats of "
           "%d calls\n",
           vocab, repeats, calls);
    double portable_med = 0;
    int rc = 0;
    for (int p = 0; p < 4; p++) {
        if (!eng_argmax_supported(paths[p])) {
            printf("%-18s not supported on this CPU\n", names[p]);
            continue;
        }
        double t[1000];
        volatile int32_t sink = 0;
        for (int r = 0; r < repeats; r++) {
            const uint64_t t0 = bench_now_ns();
            for (int c = 0; c < calls; c++) sink = eng_argmax(paths[p], v, vocab);
            t[r] = (double)(bench_now_ns() - t0) / calls / 1e3;
            if (sink != top) {
                fprintf(stderr, "argmax_bench: %s gave %d, expected %d\n", names[p], (int)sink,
                        top);
                rc = 1;
            }
        }
        const double med = bench_median(t, repeats); /* sorts t */
        if (p == 0) portable_med = med;
        printf("%-18s %8.2f [%.2f, %.2f]  %5.1fx the scalar loop\n", names[p], med, t[0],
               t[repeats - 1], portable_med / med);
    }
    free(v);
    return rc;
}
