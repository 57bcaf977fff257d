/* SPDX-License-Identifier: MIT */
/*
 * quant_bench — the weight types' decode products (kernels/cpu/quant.h q_matmul) on the
 * projections of one layer of a model shape (wq wk wv wo, w1 w3, w2), one thread, for M
 * activation rows: the weight bytes read per second and each type's time per layer against
 * Q8_0's, timed in the same repeat (the types alternate within each repeat, so load from
 * other users of the machine hits them alike). The layers cycle through copies far larger
 * than the caches (--mib of weights per type), so each product reads its weights from memory
 * as decode does. Medians of --repeats, with the lowest and highest.
 *
 *   quant_bench [--shape stories110M|stories15M] [--types Q8_0,Q4_0,...] [--rows 1,2,4,32]
 *               [--repeats R] [--mib M] [--isa avx2|portable] [--clock cpu] [--json]
 *               [--packed]
 *
 * --packed times each type that has a packed layout (q_pack: Q4_K, Q6_K with AVX-512 VNNI)
 * again, read from copies packed once as the engine packs them at load ("Q4_K/p"; GB/s of
 * the file's bytes, the activations quantized per product as q_matmul does). --isa caps the kernels' instruction set (q_isa_cap); --clock cpu times the thread's CPU
 * time instead of wall time (figures from a machine busy with others).
 */
#include "kernels/cpu/quant.h"
#include "perf/bench_util.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const struct {
    const char *name;
    int type;
} type_names[] = {{"F32", Q_F32},   {"F16", Q_F16},   {"BF16", Q_BF16},     {"Q8_0", Q_Q8_0},
                  {"Q4_K", Q_Q4_K}, {"Q6_K", Q_Q6_K}, {"Q4_0", Q_Q4_0},     {"Q4_1", Q_Q4_1},
                  {"Q5_0", Q_Q5_0}, {"Q5_1", Q_Q5_1}, {"IQ4_NL", Q_IQ4_NL}, {"Q2_K", Q_Q2_K},
                  {"Q3_K", Q_Q3_K}, {"Q5_K", Q_Q5_K}, {"IQ4_XS", Q_IQ4_XS}};

static int type_of(const char *s)
{
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (strcmp(type_names[i].name, s) == 0) return type_names[i].type;
    return -1;
}

static const char *name_of(int type)
{
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (type_names[i].type == type) return type_names[i].name;
    return "?";
}

/* The name of a type read from its packing (--packed). */
static const char *packed_name(int type)
{
    return type == Q_Q4_K ? "Q4_K/p" : type == Q_Q6_K ? "Q6_K/p" : "?/p";
}

typedef struct proj {
    int n, k; /* weight rows, row length */
} proj;

#define N_PROJ 7

/* One layer of weights of `type`, quantized once, then copied n_layers times; with pk, each
 * copy's projections packed once (q_pack) as the engine packs them at load. */
typedef struct layer_set {
    int type;
    size_t layer_bytes, off[N_PROJ];
    int n_layers;
    char *w;
    char *pk; /* the packed copies (--packed), or NULL */
    size_t pk_layer_bytes, pk_off[N_PROJ];
} layer_set;

/* The activations quantized per product when the packing is read (q_matmul does it itself). */
static void *xq_mem;
static size_t xq_cap;

/* ls's layers packed (the packed set timed beside the weights as they lie), or -1. */
static int layer_pack(layer_set *ls, const layer_set *from, const proj *p)
{
    *ls = *from;
    size_t bytes = 0;
    for (int i = 0; i < N_PROJ; i++) {
        ls->pk_off[i] = bytes;
        const size_t b = q_packed_bytes(ls->type, p[i].n, p[i].k);
        if (!b) return -1;
        bytes += (b + 63) & ~(size_t)63;
    }
    ls->pk_layer_bytes = bytes;
    ls->pk = aligned_alloc(64, bytes * (size_t)ls->n_layers);
    if (!ls->pk) return -1;
    for (int l = 0; l < ls->n_layers; l++)
        for (int i = 0; i < N_PROJ; i++)
            if (!q_pack(ls->type, ls->w + (size_t)l * ls->layer_bytes + ls->off[i], p[i].n, p[i].k,
                        ls->pk + (size_t)l * bytes + ls->pk_off[i]))
                return -1;
    return 0;
}

static int layer_fill(layer_set *ls, int type, const proj *p, const float *src, size_t mib)
{
    size_t bytes = 0;
    for (int i = 0; i < N_PROJ; i++) {
        ls->off[i] = bytes;
        bytes += q_row_bytes(type, p[i].k) * (size_t)p[i].n;
    }
    ls->type = type;
    ls->layer_bytes = bytes;
    ls->n_layers = (int)((mib << 20) / bytes) + 1;
    ls->w = malloc(bytes * (size_t)ls->n_layers);
    if (!ls->w) return -1;
    for (int i = 0; i < N_PROJ; i++) {
        const size_t rb = q_row_bytes(type, p[i].k);
        for (int r = 0; r < p[i].n; r++)
            q_quantize_row(type, src + (size_t)r * p[i].k, ls->w + ls->off[i] + (size_t)r * rb,
                           p[i].k);
    }
    for (int l = 1; l < ls->n_layers; l++) memcpy(ls->w + (size_t)l * bytes, ls->w, bytes);
    return 0;
}

/* Seconds per layer: `passes` passes over every layer, M rows of x. */
static double time_layers(const layer_set *ls, const proj *p, const float *x, int M, float *y,
                          int passes)
{
    const double t0 = now_s();
    for (int pass = 0; pass < passes; pass++)
        for (int l = 0; l < ls->n_layers; l++) {
            const char *base = ls->w + (size_t)l * ls->layer_bytes;
            for (int i = 0; i < N_PROJ; i++) {
                if (ls->pk) {
                    const q_xq *a = q_xq_prepare(xq_mem, xq_cap, x, M, p[i].k);
                    if (q_matmul_packed(ls->type,
                                        ls->pk + (size_t)l * ls->pk_layer_bytes + ls->pk_off[i], 0,
                                        p[i].n, p[i].k, a, M, 0.0f, y, p[i].n))
                        continue;
                }
                q_matmul(ls->type, base + ls->off[i], p[i].n, p[i].k, x, M, 0.0f, y, p[i].n);
            }
        }
    return (now_s() - t0) / ((double)passes * ls->n_layers);
}

static int parse_list(const char *arg, char out[][16], int max)
{
    int n = 0;
    const char *s = arg;
    while (*s && n < max) {
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= 16) return -1;
        memcpy(out[n], s, len);
        out[n++][len] = 0;
        s += len;
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *shape_name = "stories110M",
               *types_arg = "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,IQ4_NL,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_XS";
    const char *rows_arg = "1,2,4,32";
    int repeats = 5, json = 0, isa = -1, packed = 0;
    size_t mib = 96;
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"types", required_argument, 0, 't'},
        {"rows", required_argument, 0, 'm'},  {"repeats", required_argument, 0, 'r'},
        {"mib", required_argument, 0, 'M'},   {"isa", required_argument, 0, 'i'},
        {"clock", required_argument, 0, 'c'}, {"json", no_argument, 0, 'j'},
        {"packed", no_argument, 0, 'p'},      {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "s:t:m:r:M:i:c:jp", opts, NULL)) != -1) {
        switch (ch) {
        case 's': shape_name = optarg; break;
        case 't': types_arg = optarg; break;
        case 'm': rows_arg = optarg; break;
        case 'r': repeats = atoi(optarg); break;
        case 'M': mib = (size_t)atol(optarg); break;
        case 'i':
            isa = strcmp(optarg, "avx2") == 0       ? Q_ISA_AVX2
                  : strcmp(optarg, "portable") == 0 ? Q_ISA_PORTABLE
                                                    : -2;
            break;
        case 'c':
            bench_clock = strcmp(optarg, "cpu") == 0 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
            break;
        case 'j': json = 1; break;
        case 'p': packed = 1; break;
        default: isa = -2; break;
        }
    }
    int dim, hidden;
    if (strcmp(shape_name, "stories110M") == 0)
        dim = 768, hidden = 2048;
    else if (strcmp(shape_name, "stories15M") == 0)
        dim = 288, hidden = 768;
    else
        dim = hidden = 0;
    char tnames[32][16], rnames[32][16];
    const int n_types = parse_list(types_arg, tnames, 32),
              n_rows = parse_list(rows_arg, rnames, 32);
    int types[32], rows[32], max_m = 1;
    bool bad = isa == -2 || dim == 0 || n_types < 1 || n_rows < 1 || repeats < 1 || repeats > 64 ||
               mib < 1 || mib > 4096;
    for (int i = 0; i < n_types && !bad; i++)
        bad = (types[i] = type_of(tnames[i])) < 0 || types[i] == Q_F32;
    for (int i = 0; i < n_rows && !bad; i++) {
        rows[i] = atoi(rnames[i]);
        bad = rows[i] < 1 || rows[i] > 256;
        max_m = rows[i] > max_m ? rows[i] : max_m;
    }
    if (bad) {
        fprintf(stderr,
                "usage: quant_bench [--shape stories110M|stories15M] [--types Q8_0,Q4_0,...] "
                "[--rows 1,2,4,32] [--repeats 1..64] [--mib 1..4096] [--isa avx2|portable] "
                "[--clock cpu] [--json] [--packed]\n"
                "  types: F16 BF16 Q8_0 Q4_K Q6_K Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q5_K "
                "IQ4_XS\n");
        return 2;
    }
    if (isa >= 0) q_isa_cap(isa);
    const proj p[N_PROJ] = {{dim, dim},    {dim, dim},    {dim, dim},   {dim, dim},
                            {hidden, dim}, {hidden, dim}, {dim, hidden}};
    /* one layer's weights (the largest projection), and the activation rows */
    float *src = malloc((size_t)hidden * dim * sizeof *src);
    float *x = malloc((size_t)max_m * hidden * sizeof *x);
    float *y = malloc((size_t)max_m * hidden * sizeof *y);
    layer_set *ls = calloc(2 * (size_t)n_types + 1, sizeof *ls);
    if (!src || !x || !y || !ls) {
        fprintf(stderr, "quant_bench: out of memory\n");
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)hidden * dim; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        src[i] = (float)((s >> 40) * (1.0 / 16777216.0) * 2 - 1);
    }
    for (size_t i = 0; i < (size_t)max_m * hidden; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((s >> 40) * (1.0 / 16777216.0) * 2 - 1);
    }
    /* Q8_0, the reference, first (added when not asked for) */
    int all[65], n_all = 0;
    all[n_all++] = Q_Q8_0;
    for (int i = 0; i < n_types; i++)
        if (types[i] != Q_Q8_0) all[n_all++] = types[i];
    for (int i = 0; i < n_all; i++)
        if (layer_fill(&ls[i], all[i], p, src, mib)) {
            fprintf(stderr, "quant_bench: out of memory for %s\n", name_of(all[i]));
            return 1;
        }
    /* --packed: each type that has a packed layout again, read from its packing */
    for (int i = 0, n = n_all; packed && i < n; i++)
        if (q_packed_bytes(all[i], p[0].n, p[0].k) && layer_pack(&ls[n_all], &ls[i], p) == 0)
            all[n_all++] = all[i];
    xq_cap = q_xq_bytes(max_m, hidden);
    xq_mem = malloc(xq_cap);
    double macs = 0;
    for (int i = 0; i < N_PROJ; i++) macs += (double)p[i].n * p[i].k;
    if (json)
        printf("{\"shape\":\"%s\",\"threads\":1,\"repeats\":%d,\"isa\":\"%s\",\"results\":[",
               shape_name, repeats, q_isa_name(q_isa()));
    else
        printf("quant_bench %s, one layer (%.1f M weights), 1 thread, %s kernels, %zu MiB a "
               "type, medians of %d [lowest, highest]\n"
               "%-7s %3s %5s %22s %8s %8s %22s\n",
               shape_name, macs * 1e-6, q_isa_name(q_isa()), mib, repeats, "type", "M", "bits",
               "us/layer", "GB/s", "GMAC/s", "speed vs Q8_0");
    int first = 1;
    for (int ri = 0; ri < n_rows; ri++) {
        const int M = rows[ri];
        double t[65][64], rel[65][64];
        for (int r = 0; r < repeats; r++)
            for (int i = 0; i < n_all; i++) {
                /* at least ~0.1 s of Q8_0 reads at 10 GB/s, whole passes */
                const int passes =
                    (int)(1e9 / 10 / ((double)ls[0].layer_bytes * ls[0].n_layers)) + 1;
                t[i][r] = time_layers(&ls[i], p, x, M, y, passes);
            }
        for (int i = 0; i < n_all; i++) {
            for (int r = 0; r < repeats; r++) rel[i][r] = t[0][r] / t[i][r];
            double tt[64], rr[64];
            memcpy(tt, t[i], sizeof(double) * (size_t)repeats);
            memcpy(rr, rel[i], sizeof(double) * (size_t)repeats);
            const double med = bench_median(tt, repeats), rmed = bench_median(rr, repeats);
            const double bits = 8.0 * (double)ls[i].layer_bytes / macs;
            const double gbs = (double)ls[i].layer_bytes / med * 1e-9;
            const double gmac = macs * M / med * 1e-9;
            if (json)
                printf("%s{\"type\":\"%s\",\"m\":%d,\"bits_per_weight\":%.3f,\"us_per_layer\":"
                       "{\"median\":%.2f,\"lowest\":%.2f,\"highest\":%.2f},\"read_gb_s\":%.3f,"
                       "\"gmac_s\":%.3f,\"speed_vs_q8_0\":{\"median\":%.3f,\"lowest\":%.3f,"
                       "\"highest\":%.3f}}",
                       first ? "" : ",", ls[i].pk ? packed_name(all[i]) : name_of(all[i]), M, bits,
                       med * 1e6, tt[0] * 1e6, tt[repeats - 1] * 1e6, gbs, gmac, rmed, rr[0],
                       rr[repeats - 1]);
            else
                printf("%-7s %3d %5.2f %8.1f [%5.1f,%5.1f] %8.2f %8.2f %6.2fx [%4.2f,%4.2f]\n",
                       ls[i].pk ? packed_name(all[i]) : name_of(all[i]), M, bits, med * 1e6,
                       tt[0] * 1e6, tt[repeats - 1] * 1e6, gbs, gmac, rmed, rr[0], rr[repeats - 1]);
            first = 0;
        }
    }
    if (json) printf("]}\n");
    for (int i = 0; i < n_all; i++) free(ls[i].pk ? ls[i].pk : ls[i].w); /* pk: w is shared */
    free(xq_mem);
    free(ls);
    free(src);
    free(x);
    free(y);
    return 0;
}
