/* SPDX-License-Identifier: MIT */
/*
 * perf/tok_bench.c — how long encoding a prompt takes, by size, for the tokenizer's merge
 * (model/tokenizer.c: a heap of candidate merges over a linked list, O(n log n)) and, where
 * it finishes in reasonable time, for the quadratic merge it replaced (tests/tok_reference.h:
 * a rescan and a memmove per merge), with the ratio.
 *
 *   tok_bench [--runs N] [--old-max-kb K] [--shared DIR] [--node-modules DIR]
 *
 * Vocabularies: SentencePiece — stories260K's tok512.bin (DIR/models, default ../shared or
 * $RINGLM_SHARED) and Llama 2's 32000 pieces; byte-level BPE — Llama 3's 128256 tokens (the
 * last two from the @lenml packages under tests/node/node_modules, written to a GGUF file
 * holding only the vocabulary; skipped when absent). Texts: "prose" (words, punctuation and
 * newlines from a seeded generator) of 1, 16, 64, 256 KB and 1 MiB, and "spaces" (one run of
 * blanks: one pre-tokenized word for BPE, the degenerate case of its merge loop). Each figure
 * is the median of N runs (default 5) of tok_encode, wall-clock and the thread's CPU time
 * (the figure that means something on a shared machine; the ratio is of CPU times); the
 * quadratic merge runs up to --old-max-kb (default 64; one run above 16 KB). Output: one
 * line per case and a JSON summary (bench_json_print).
 */
#include "model/gguf_write.h"
#include "model/tokenizer.h"
#include "perf/bench_util.h"
#include "perf/bench_vocab.h"
#include "tests/tok_reference.h"

#include <getopt.h>

/* Seeded prose: lower-case words with capitals, commas, full stops and paragraph breaks. */
static char *prose(size_t len, unsigned seed)
{
    static const char *const words[] = {
        "the",  "a",   "once",    "upon",   "time",  "there", "was",   "little",  "girl",   "named",
        "Lily", "she", "liked",   "to",     "play",  "in",    "park",  "with",    "her",    "dog",
        "sun",  "was", "shining", "and",    "birds", "sang",  "happy", "because", "friend", "tree",
        "big",  "red", "ball",    "jumped", "over",  "river", "mom",   "said",    "let's",  "go"};
    const size_t nw = sizeof words / sizeof words[0];
    char *s = malloc(len + 64);
    size_t n = 0;
    bool cap = true;
    while (n < len) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % nw];
        size_t l = strlen(w);
        if (n) s[n++] = ' ';
        memcpy(s + n, w, l);
        if (cap && s[n] >= 'a' && s[n] <= 'z') s[n] = (char)(s[n] - 32);
        n += l;
        cap = false;
        unsigned r = (seed >> 8) % 40;
        if (r < 3) s[n++] = ',';
        if (r >= 3 && r < 6) {
            s[n++] = '.';
            cap = true;
            if (r == 5) s[n++] = '\n';
        }
    }
    s[len] = '\0';
    return s;
}

static char *spaces(size_t len)
{
    char *s = malloc(len + 1);
    memset(s, ' ', len);
    s[len] = '\0';
    return s;
}

typedef int encode_fn(const tok_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out,
                      int max);

/* Median wall-clock milliseconds of runs encodes, and in *cpu_ms the median CPU time of the
 * thread (what the merge costs when the machine is shared); *n_tokens receives the count. */
static double time_encode(encode_fn *f, const tok_tokenizer *t, const char *text, int runs,
                          int *n_tokens, double *cpu_ms)
{
    int cap = (int)tok_encode_bound(text);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    double ms[64], cpu[64];
    if (!ids) bench_die("out of memory");
    for (int r = 0; r < runs; r++) {
        uint64_t t0 = bench_now_ns(), c0 = bench_thread_cpu_ns();
        *n_tokens = f(t, text, true, false, ids, cap);
        cpu[r] = (double)(bench_thread_cpu_ns() - c0) / 1e6;
        ms[r] = (double)(bench_now_ns() - t0) / 1e6;
        if (*n_tokens < 0) bench_die("encode: %s", tok_errmsg());
    }
    free(ids);
    *cpu_ms = bench_median(cpu, runs);
    return bench_median(ms, runs);
}

int main(int argc, char **argv)
{
    bench_prog = "tok_bench";
    int runs = 5, old_max_kb = 64;
    const char *shared = getenv("RINGLM_SHARED");
    const char *node_modules = "tests/node/node_modules";
    if (!shared || !*shared) shared = "../shared";
    static const struct option opts[] = {{"runs", required_argument, 0, 'r'},
                                         {"old-max-kb", required_argument, 0, 'o'},
                                         {"shared", required_argument, 0, 's'},
                                         {"node-modules", required_argument, 0, 'n'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "r:o:s:n:", opts, NULL)) != -1) {
        switch (ch) {
        case 'r': runs = atoi(optarg); break;
        case 'o': old_max_kb = atoi(optarg); break;
        case 's': shared = optarg; break;
        case 'n': node_modules = optarg; break;
        default:
            fprintf(stderr, "usage: tok_bench [--runs N] [--old-max-kb K] [--shared DIR] "
                            "[--node-modules DIR]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64) bench_die("--runs: 1..64");
    bench_mkdtemp("tok_bench");
    char tok512[600];
    snprintf(tok512, sizeof tok512, "%s/models/tok512.bin", shared);
    struct {
        const char *name, *kind, *path;
    } vocabs[] = {
        {"tok512 (stories260K)", "spm", access(tok512, R_OK) == 0 ? tok512 : NULL},
        {"llama2 (32000)", "spm", bench_hf_vocab(node_modules, "llama2", 32000)},
        {"llama3 (128256)", "bpe", bench_hf_vocab(node_modules, "llama3", 128256)},
    };
    static const size_t sizes_kb[] = {1, 16, 64, 256, 1024};
    json_t *cases = json_array();
    printf("%-22s %-6s %6s %8s %10s %10s %10s %10s %7s\n", "vocabulary", "text", "KB", "tokens",
           "heap ms", "heap cpu", "old ms", "old cpu", "ratio");
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        if (!vocabs[v].path) continue;
        tok_tokenizer *t;
        if (tok_load(vocabs[v].path, 0, &t)) bench_die("%s", tok_errmsg());
        for (int kind = 0; kind < 2; kind++) {
            for (size_t s = 0; s < sizeof sizes_kb / sizeof sizes_kb[0]; s++) {
                size_t len = sizes_kb[s] * 1024;
                char *text = kind == 0 ? prose(len, 42) : spaces(len);
                int n_new, n_old = 0;
                double cpu_new, cpu_old = -1;
                double ms_new = time_encode(tok_encode, t, text, runs, &n_new, &cpu_new);
                double ms_old = -1;
                if ((int)sizes_kb[s] <= old_max_kb) {
                    ms_old = time_encode(ref_encode, t, text, sizes_kb[s] > 16 ? 1 : runs, &n_old,
                                         &cpu_old);
                    if (n_old != n_new)
                        bench_die("%s: %d tokens, the quadratic merge %d", vocabs[v].name, n_new,
                                  n_old);
                }
                char old_s[32] = "-", oldc_s[32] = "-", ratio_s[32] = "-";
                if (ms_old >= 0) {
                    snprintf(old_s, sizeof old_s, "%.2f", ms_old);
                    snprintf(oldc_s, sizeof oldc_s, "%.2f", cpu_old);
                    snprintf(ratio_s, sizeof ratio_s, "%.1f", cpu_old / cpu_new);
                }
                printf("%-22s %-6s %6zu %8d %10.2f %10.2f %10s %10s %7s\n", vocabs[v].name,
                       kind ? "spaces" : "prose", sizes_kb[s], n_new, ms_new, cpu_new, old_s,
                       oldc_s, ratio_s);
                fflush(stdout);
                json_t *c =
                    json_pack("{s:s, s:s, s:s, s:I, s:i, s:f}", "vocabulary", vocabs[v].name,
                              "tokenizer", vocabs[v].kind, "text", kind ? "spaces" : "prose", "kb",
                              (json_int_t)sizes_kb[s], "tokens", n_new, "heap_ms", ms_new);
                json_object_set_new(c, "heap_cpu_ms", json_real(cpu_new));
                if (ms_old >= 0) {
                    json_object_set_new(c, "old_ms", json_real(ms_old));
                    json_object_set_new(c, "old_cpu_ms", json_real(cpu_old));
                    json_object_set_new(c, "cpu_ratio", json_real(cpu_old / cpu_new));
                }
                json_array_append_new(cases, c);
                free(text);
            }
        }
        tok_free(t);
    }
    bench_json_print(json_pack("{s:s, s:i, s:i, s:o}", "bench", "tok_bench", "runs", runs,
                               "old_max_kb", old_max_kb, "cases", cases));
    bench_cleanup();
    return 0;
}
