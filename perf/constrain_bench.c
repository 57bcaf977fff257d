/* SPDX-License-Identifier: MIT */
/*
 * perf/constrain_bench.c — what structured output costs end to end: one ringlmd (the build's
 * bin/, with the model's tokenizer so it enforces constraints), S sequences (default 32)
 * submitted at once, each generating exactly G tokens (default 128), once plain and once
 * under a JSON Schema (every step's mask computed by the daemon's mask thread while the
 * forward pass runs), the two alternating within each run (which goes first alternates too)
 * so the load of a shared machine hits both alike. Prints, per mode, the median over the runs
 * of the decode rate (S × (G - 1) tokens from the last sequence's first token to the last
 * FINISH) and of the end-to-end rate (S × G from submit to the last FINISH), their ratios,
 * the load average before and after, and the daemon's own account of the masks (its log at
 * exit: masks computed, time on the mask thread, time the loop waited for them).
 *
 * Both modes sample (temperature 1, a seed per sequence) with the stop tokens biased to -100
 * and ignore_stop, so both generate exactly G tokens; the default schema is an array of at least
 * 100 objects, so the constrained answer cannot end within the bench's tokens. A warm-up constrained
 * round first (the compile, and the matchers' first masks) is reported apart.
 *
 *   constrain_bench --model M [--tokenizer T] [--seqs S] [--gen G] [--runs R]
 *                   [--threads N] [--schema FILE] [--json]
 */
#include "perf/bench_util.h"

#include <dirent.h>
#include <getopt.h>
#include <stdbool.h>

#include "libclient/ringlm.h"

static const char default_schema[] =
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]}}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false},\"minItems\":100}";

typedef struct round_t {
    double e2e_tps, decode_tps;
    double cpu_tps; /* tokens per second of the daemon's CPU time (all its threads) */
    uint32_t tokens;
} round_t;

static pid_t daemon_pid;

/* The daemon's CPU time so far, all threads, in ns (/proc/PID/task/TID/schedstat: ns
 * resolution, where the tick-counted utime would be 10 ms). */
static uint64_t daemon_cpu_ns(void)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)daemon_pid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s/schedstat", dir, de->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        unsigned long long ns = 0;
        if (fscanf(f, "%llu", &ns) == 1) sum += ns;
        fclose(f);
    }
    closedir(d);
    return sum;
}

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* One round: S requests at once, each G tokens; the two rates. */
static round_t run_round(ringlm_client *c, const int32_t *prompt, uint32_t n_prompt, int S, int G,
                         const ringlm_sampling *smp_one, int round_no)
{
    ringlm_request rq[256];
    ringlm_sampling smp[256];
    uint64_t ids[256];
    for (int i = 0; i < S; i++) {
        ringlm_request_init(&rq[i]);
        rq[i].prompt = prompt;
        rq[i].n_prompt = n_prompt;
        rq[i].max_new_tokens = (uint32_t)G;
        rq[i].temperature = 1.0f;
        rq[i].seed = (uint64_t)round_no * 1000 + (uint64_t)i;
        rq[i].ignore_stop = true;
        smp[i] = *smp_one;
    }
    uint64_t cpu0 = daemon_cpu_ns();
    uint64_t t0 = bench_now_us(), t_first_all = 0;
    int rc = ringlm_submit_batch_ext(c, rq, smp, (uint32_t)S, ids);
    if (rc < 0) bench_die("submit: %s (%s)", ringlm_strerror(rc), ringlm_errdetail());
    int left = S, firsts = 0;
    bool got[256] = {0};
    uint32_t tokens = 0;
    static int32_t seen[256][8]; /* each request's first tokens, for a failure's message */
    static uint32_t n_seen[256];
    memset(n_seen, 0, sizeof n_seen);
    while (left) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, 60000);
        if (rc <= 0) bench_die("next_event: %d (%s)", rc, ringlm_errdetail());
        int k = (int)(ev.req_id - ids[0]);
        if (k < 0 || k >= S) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            tokens++;
            if (n_seen[k] < 8) seen[k][n_seen[k]++] = ev.token;
            if (!got[k]) {
                got[k] = true;
                if (++firsts == S) t_first_all = bench_now_us();
            }
        } else if (ev.kind == RINGLM_EV_FINISH) {
            if (ev.finish_reason != RINGLM_FINISH_LENGTH) {
                char first[128] = "";
                for (uint32_t j = 0; j < n_seen[k]; j++)
                    snprintf(first + strlen(first), sizeof first - strlen(first), " %d",
                             seen[k][j]);
                bench_die("request %d ended %s/%s: %s (its first tokens:%s)", k,
                          ringlm_reason_name(ev.finish_reason),
                          ringlm_reason_name(ev.reject_reason),
                          ringlm_event_detail(c) ? ringlm_event_detail(c) : "", first);
            }
            left--;
        }
    }
    uint64_t t1 = bench_now_us();
    uint64_t cpu1 = daemon_cpu_ns();
    round_t r = {.tokens = tokens};
    r.cpu_tps = cpu1 > cpu0 ? (double)tokens / ((double)(cpu1 - cpu0) / 1e9) : 0.0;
    r.e2e_tps = (double)tokens / ((double)(t1 - t0) / 1e6);
    r.decode_tps =
        t1 > t_first_all ? (double)(S * (G - 1)) / ((double)(t1 - t_first_all) / 1e6) : 0.0;
    return r;
}

int main(int argc, char **argv)
{
    bench_prog = "constrain_bench";
    const char *model = NULL, *tok_path = NULL, *schema_path = NULL, *threads = "1";
    int S = 32, G = 128, runs = 5;
    bool as_json = false;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"tokenizer", required_argument, 0, 'z'},
                                         {"seqs", required_argument, 0, 's'},
                                         {"gen", required_argument, 0, 'g'},
                                         {"runs", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'},
                                         {"schema", required_argument, 0, 'j'},
                                         {"json", no_argument, 0, 'J'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'z': tok_path = optarg; break;
        case 's': S = atoi(optarg); break;
        case 'g': G = atoi(optarg); break;
        case 'r': runs = atoi(optarg); break;
        case 't': threads = optarg; break;
        case 'j': schema_path = optarg; break;
        case 'J': as_json = true; break;
        default:
            fprintf(stderr, "usage: constrain_bench --model M [--tokenizer T] [--seqs S] [--gen G] "
                            "[--runs R] [--threads N] [--schema FILE] [--json]\n");
            return 2;
        }
    }
    if (!model) bench_die("--model is required");
    if (S < 1 || S > 256 || G < 2 || runs < 1 || runs > 64) bench_die("bad --seqs/--gen/--runs");
    char *schema = (char *)default_schema;
    if (schema_path) {
        FILE *f = fopen(schema_path, "rb");
        if (!f) bench_die("%s: %s", schema_path, strerror(errno));
        static char buf[256 << 10];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        schema = buf;
    }
    const char *bin = getenv("RINGLM_BIN") ? getenv("RINGLM_BIN") : "build/bin";
    bench_mkdtemp("cbench");
    char ringlmd[512], sock[256], log[256];
    snprintf(ringlmd, sizeof ringlmd, "%s/ringlmd", bin);
    snprintf(sock, sizeof sock, "%s/s.sock", bench_dir);
    snprintf(log, sizeof log, "%s/ringlmd.log", bench_dir);
    char *dargv[16];
    int n = 0;
    dargv[n++] = ringlmd;
    dargv[n++] = "--socket";
    dargv[n++] = sock;
    dargv[n++] = "--numa-node";
    dargv[n++] = "off";
    dargv[n++] = "--model";
    dargv[n++] = (char *)model;
    dargv[n++] = "--threads";
    dargv[n++] = (char *)threads;
    if (tok_path) {
        dargv[n++] = "--tokenizer";
        dargv[n++] = (char *)tok_path;
    }
    dargv[n] = NULL;
    pid_t dpid = bench_spawn(dargv, log);
    daemon_pid = dpid;
    bench_wait_path(sock);
    ringlm_client *c = NULL;
    for (int i = 0; i < 3000 && ringlm_connect(sock, &c) < 0; i++) usleep(10000);
    if (!c) bench_die("cannot connect to %s (see %s)", sock, log);
    if (!(ringlm_constraint_kinds(c) & (1 << RINGLM_CONSTRAINT_JSON_SCHEMA)))
        bench_die("the daemon enforces no JSON Schema (give --tokenizer for a llama2.c model)");

    /* the prompt, and the stop tokens biased away in both modes */
    ringlm_tokenizer *tok = NULL;
    const char *tp = tok_path ? tok_path : model;
    int vocab = ringlm_vocab_size(c);
    if (ringlm_tokenizer_load(tp, vocab, &tok) < 0)
        bench_die("tokenizer %s: %s", tp, ringlm_errdetail());
    int32_t prompt[64];
    int np = ringlm_tokenize(tok, "Once upon a time", RINGLM_TOKENIZE_BOS, prompt, 64);
    if (np < 1) bench_die("tokenize: %s", ringlm_errdetail());
    ringlm_logit_bias bias[3];
    uint32_t nb = 0;
    int32_t stops[3] = {ringlm_tokenizer_bos(tok), ringlm_tokenizer_eos(tok),
                        ringlm_tokenizer_eot(tok)};
    for (int i = 0; i < 3; i++) {
        bool dup = false;
        for (uint32_t k = 0; k < nb; k++) dup |= bias[k].token == stops[i];
        if (stops[i] >= 0 && stops[i] < vocab && !dup)
            bias[nb++] = (ringlm_logit_bias){stops[i], -100.0f};
    }
    ringlm_sampling plain, cons;
    ringlm_sampling_init(&plain);
    plain.logit_bias = bias;
    plain.n_logit_bias = nb;
    cons = plain;
    cons.constraint_kind = RINGLM_CONSTRAINT_JSON_SCHEMA;
    cons.constraint = schema;
    cons.constraint_bytes = strlen(schema);

    double load_before = load1();
    round_t warm = run_round(c, prompt, (uint32_t)np, S, G, &cons, 999);
    double pe[64], pd[64], ce[64], cd[64], re[64], rd[64], pc[64], cc[64], rc_[64];
    for (int r = 0; r < runs; r++) {
        round_t a, b;
        if (r % 2 == 0) {
            a = run_round(c, prompt, (uint32_t)np, S, G, &plain, r);
            b = run_round(c, prompt, (uint32_t)np, S, G, &cons, r);
        } else {
            b = run_round(c, prompt, (uint32_t)np, S, G, &cons, r);
            a = run_round(c, prompt, (uint32_t)np, S, G, &plain, r);
        }
        pe[r] = a.e2e_tps;
        pd[r] = a.decode_tps;
        ce[r] = b.e2e_tps;
        cd[r] = b.decode_tps;
        re[r] = b.e2e_tps / a.e2e_tps;
        rd[r] = b.decode_tps / a.decode_tps;
        pc[r] = a.cpu_tps;
        cc[r] = b.cpu_tps;
        rc_[r] = b.cpu_tps / a.cpu_tps;
        if (!as_json)
            fprintf(stderr,
                    "run %d: decode plain %.0f tok/s, constrained %.0f (%.3fx); end to end "
                    "%.0f / %.0f (%.3fx); per daemon CPU-second %.0f / %.0f (%.3fx)\n",
                    r + 1, a.decode_tps, b.decode_tps, rd[r], a.e2e_tps, b.e2e_tps, re[r],
                    a.cpu_tps, b.cpu_tps, rc_[r]);
    }
    double load_after = load1();
    ringlm_close(c);
    ringlm_tokenizer_free(tok);
    bench_stop(&dpid);
    /* the daemon's account of the masks, written at exit */
    char dline[512] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strstr(line, "ringlmd: constraints: ") && strstr(line, "masks"))
                snprintf(dline, sizeof dline, "%s", line + strlen("ringlmd: "));
        fclose(f);
    }
    dline[strcspn(dline, "\n")] = 0;
    double mpd = bench_median(pd, runs), mcd = bench_median(cd, runs), mpe = bench_median(pe, runs),
           mce = bench_median(ce, runs), mrd = bench_median(rd, runs), mre = bench_median(re, runs),
           mpc = bench_median(pc, runs), mcc = bench_median(cc, runs),
           mrc = bench_median(rc_, runs);
    if (as_json) {
        json_t *o = json_pack(
            "{s:s, s:i, s:i, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:f, s:f, s:f, s:s}",
            "model", model, "seqs", S, "gen", G, "runs", runs, "threads", threads,
            "decode_plain_tps", mpd, "decode_constrained_tps", mcd, "decode_ratio", mrd,
            "e2e_plain_tps", mpe, "e2e_constrained_tps", mce, "e2e_ratio", mre, "cpu_plain_tps",
            mpc, "cpu_constrained_tps", mcc, "cpu_ratio", mrc, "warmup_constrained_decode_tps",
            warm.decode_tps, "load_before", load_before, "load_after", load_after, "daemon", dline);
        bench_json_print(o);
        json_decref(o);
    } else {
        printf("constrain_bench: %s, %d sequences x %d tokens, %d runs, %s engine thread(s)\n",
               model, S, G, runs, threads);
        printf("  decode      plain %.0f tok/s, constrained %.0f tok/s: %.3fx (median of the "
               "per-run ratios)\n",
               mpd, mcd, mrd);
        printf("  end to end  plain %.0f tok/s, constrained %.0f tok/s: %.3fx\n", mpe, mce, mre);
        printf("  per second of the daemon's CPU (all its threads): plain %.0f tok, constrained "
               "%.0f tok: %.3fx\n",
               mpc, mcc, mrc);
        printf("  warm-up constrained round (compile, first masks): decode %.0f tok/s\n",
               warm.decode_tps);
        printf("  load average %.2f before, %.2f after\n", load_before, load_after);
        if (dline[0]) printf("  daemon: %s\n", dline);
    }
    bench_cleanup();
    return 0;
}
