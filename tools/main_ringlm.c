/* SPDX-License-Identifier: MIT */
/*
 * ringlm — the command-line client of ringlmd.
 *
 *   ringlm [--socket PATH] generate --prompt TEXT --tokenizer T [options]
 *   ringlm [--socket PATH] replay TRACE [options]
 *
 * generate streams decoded text exactly as llama2.c's run.c prints it (prompt pieces, then
 * generated pieces, then a newline), so a greedy run can be compared byte for byte with the
 * reference. replay drives the daemon open-loop from a recorded trace (native JSONL, Azure
 * CSV, Mooncake JSONL) from several client processes and reports latency percentiles per
 * tenant.
 *
 * Every subcommand takes --socket PATH (default $RINGLM_SOCKET, else RINGLM_DEFAULT_SOCKET,
 * the path ringlmd uses by default too).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tools/cli.h"
#include "tools/replay.h"

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "unknown"
#endif

/* ======================================================================================= */
/* generate                                                                                */
/* ======================================================================================= */

static void usage_generate(FILE *f)
{
    fprintf(f,
            "usage: ringlm [--socket PATH] generate --prompt TEXT --tokenizer FILE [options]\n"
            "  --max-tokens N     new tokens to generate (default 256)\n"
            "  --steps N          instead of --max-tokens: total positions including the prompt,\n"
            "                     as llama2.c run.c's -n (max-tokens = N - prompt tokens + 1)\n"
            "  --temperature F    0 = greedy (default 0)\n"
            "  --top-k K          0 = off;  --top-p P  1 = off;  --seed S\n"
            "  --class C          request class (default: the daemon's \"default\")\n"
            "  --tenant TAG       tenant tag (honoured only for uids the daemon trusts)\n"
            "  --deadline-ms N    give up after N ms (the daemon times the request out)\n"
            "  --ignore-stop      the stop token does not end it: exactly --max-tokens tokens\n"
            "                     (also --ignore-eos, vLLM's name)\n"
            "  --logit-bias LIST  ID:BIAS,... added to those tokens' logits, BIAS in [-100, 100]\n"
            "  --repetition-penalty F  (0, 100], 1 = off: prompt and output tokens\n"
            "  --presence-penalty F    [-2, 2], 0 = off: output tokens\n"
            "  --frequency-penalty F   [-2, 2], 0 = off: output tokens, times their count\n"
            "  --min-p F          [0, 1], 0 = off: drop tokens below F x the most likely's\n"
            "  --stop-token-ids LIST  comma-separated ids that end the request (not printed)\n"
            "  --json-schema FILE the answer is JSON valid against the schema in FILE\n"
            "  --json-object      the answer is a JSON object\n"
            "  --regex R          the whole answer matches the regular expression R\n"
            "  --choice A,B,...   the answer is exactly one of A, B, ... (\\, escapes a comma)\n"
            "  --grammar FILE     the answer follows the GBNF grammar in FILE\n"
            "                     (one constraint at most; a daemon refuses what it does not\n"
            "                     enforce, and says why a constraint does not compile)\n"
            "  --n N              N samples of the prompt (the daemon computes it once; sample i\n"
            "                     draws as --seed + i): each printed whole when all are done,\n"
            "                     under a line \"[sample i]\"\n"
            "  --stats            print the request's timing to stderr at the end (with the\n"
            "                     prompt tokens the daemon's prefix cache served)\n"
            "  --prompt-ids LIST  instead of --prompt/--tokenizer: comma-separated token ids;\n"
            "                     the output is then token ids, one line per token\n"
            "Prints the prompt, then the generated text as it streams, then a newline.\n");
}

/* run.c's safe_printf: a piece that is a single byte, neither printable ASCII nor whitespace,
 * prints nothing (explicit ranges, so the locale cannot change the output). */
static const char *run_c_printable(const char *piece)
{
    unsigned char c = (unsigned char)piece[0];
    if (c && !piece[1] && !(c >= 0x20 && c <= 0x7e) && !(c == ' ' || (c >= '\t' && c <= '\r')))
        return "";
    return piece;
}

/* "ID,ID,..." into a malloc()ed list (*n ids). */
static int32_t *parse_ids(const char *what, const char *s, uint32_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) cli_die("out of memory");
    *n = 0;
    char *dup = cli_strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
        ids[(*n)++] = (int32_t)cli_parse_long(what, t, 0, INT32_MAX);
    free(dup);
    return ids;
}

/* "ID:BIAS,ID:BIAS,..." into a malloc()ed list (*n entries). */
static ringlm_logit_bias *parse_bias(const char *s, uint32_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    ringlm_logit_bias *b = malloc(cap * sizeof *b);
    if (!b) cli_die("out of memory");
    *n = 0;
    char *dup = cli_strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        if (!colon) cli_die("--logit-bias: '%s' is not ID:BIAS", t);
        *colon = 0;
        b[*n].token = (int32_t)cli_parse_long("--logit-bias", t, 0, INT32_MAX);
        b[*n].bias = (float)cli_parse_double("--logit-bias", colon + 1, -1e9, 1e9);
        (*n)++;
    }
    free(dup);
    return b;
}

/* --n: the samples id .. id + ns - 1, each collected until its FINISH, then printed whole
 * in order under "[sample i]" (the prompt, then its text as run.c prints it; token ids one a
 * line with --prompt-ids). A sample that draws BOS ends there (run.c). Exit 1 when any
 * sample failed. */
static int generate_samples(ringlm_client *c, const ringlm_tokenizer *tok, const int32_t *ids,
                            int n, uint64_t id, uint32_t ns, bool stats, uint64_t t0)
{
    typedef struct smp_out {
        int32_t *tok;
        uint32_t n, cap, cached;
        int finish, cause;
        bool done, bos;
    } smp_out;
    smp_out *o = calloc(ns, sizeof *o);
    if (!o) cli_die("out of memory");
    uint32_t left = ns;
    while (left) {
        ringlm_event ev;
        int rc = ringlm_next_event(c, &ev, -1);
        if (rc == -EINTR) continue;
        if (rc < 0)
            cli_die("the daemon went away mid-request: %s%s%s", ringlm_strerror(rc),
                    *ringlm_errdetail() ? " — " : "", ringlm_errdetail());
        if (ev.req_id < id || ev.req_id >= id + ns) continue;
        smp_out *x = &o[ev.req_id - id];
        if (ev.kind == RINGLM_EV_TOKEN && !x->bos) {
            if (tok && ev.token == ringlm_tokenizer_bos(tok)) {
                x->bos = true; /* run.c stops at BOS */
                ringlm_cancel(c, ev.req_id);
                continue;
            }
            if (x->n == x->cap) {
                x->cap = x->cap ? 2 * x->cap : 64;
                x->tok = realloc(x->tok, sizeof *x->tok * x->cap);
                if (!x->tok) cli_die("out of memory");
            }
            x->tok[x->n++] = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH && !x->done) {
            x->done = true;
            x->finish = x->bos ? RINGLM_FINISH_STOP : ev.finish_reason;
            x->cause = ev.reject_reason;
            x->cached = ev.n_cached_tokens;
            left--;
        }
    }
    int exit_code = 0;
    const char *piece;
    for (uint32_t i = 0; i < ns; i++) {
        printf("[sample %u]\n", i);
        if (tok) {
            for (int k = 1; k < n; k++)
                if (ringlm_token_text(tok, ids[k - 1], ids[k], &piece) == 0)
                    fputs(run_c_printable(piece), stdout);
            int32_t prev = ids[n - 1];
            for (uint32_t k = 0; k < o[i].n; k++) {
                if (ringlm_token_text(tok, prev, o[i].tok[k], &piece) == 0)
                    fputs(run_c_printable(piece), stdout);
                prev = o[i].tok[k];
            }
            fputc('\n', stdout);
        } else {
            for (uint32_t k = 0; k < o[i].n; k++) printf("%d\n", o[i].tok[k]);
        }
        int fr = o[i].finish;
        if (fr != RINGLM_FINISH_STOP && fr != RINGLM_FINISH_LENGTH) {
            fprintf(stderr, "ringlm: sample %u %s%s%s after %u tokens\n", i, ringlm_reason_name(fr),
                    o[i].cause ? ": " : "", o[i].cause ? ringlm_reason_name(o[i].cause) : "",
                    o[i].n);
            exit_code = 1;
        }
        if (stats)
            fprintf(stderr,
                    "ringlm: sample %u: %u prompt tokens (%u cached), %u generated, finish %s\n", i,
                    (unsigned)n, o[i].cached, o[i].n, ringlm_reason_name(fr));
        free(o[i].tok);
    }
    if (stats)
        fprintf(stderr, "ringlm: %u samples in %.2f ms\n", ns, (double)(cli_now_us() - t0) / 1e3);
    fflush(stdout);
    free(o);
    return exit_code;
}

/* "A,B,..." (a "\\," is a comma inside one) into NUL-separated alternatives (malloc()ed). */
static char *parse_choice(const char *s, size_t *len)
{
    char *out = malloc(strlen(s) + 1);
    if (!out) cli_die("out of memory");
    size_t n = 0;
    for (const char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] == ',')
            out[n++] = *++p;
        else
            out[n++] = *p == ',' ? 0 : *p;
    }
    out[n] = 0;
    *len = n;
    return out;
}

/* Sets the request's constraint (one at most). */
static void set_constraint(ringlm_sampling *smp, uint32_t kind, char *text, size_t len,
                           const char *flag)
{
    if (smp->constraint_kind) cli_die("generate: %s: give one constraint at most", flag);
    smp->constraint_kind = kind;
    smp->constraint = text;
    smp->constraint_bytes = len;
}

static char *read_whole(const char *flag, const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) cli_die("%s %s: %s", flag, path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) cli_die("out of memory");
    size_t got;
    while ((got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap && !(b = realloc(b, cap *= 2))) cli_die("out of memory");
    }
    fclose(f);
    *len = n;
    return b;
}

static int cmd_generate(int argc, char **argv)
{
    const char *prompt = NULL, *tok_path = NULL, *cls = NULL, *tenant = NULL, *prompt_ids = NULL;
    long max_tokens = -1, steps = -1, top_k = 0, deadline_ms = 0;
    double temperature = 0.0, top_p = 1.0;
    unsigned long long seed = 0;
    bool stats = false, ignore_stop = false;
    static const struct option opts[] = {{"prompt", required_argument, 0, 'p'},
                                         {"tokenizer", required_argument, 0, 'z'},
                                         {"max-tokens", required_argument, 0, 'n'},
                                         {"steps", required_argument, 0, 'S'},
                                         {"temperature", required_argument, 0, 't'},
                                         {"top-k", required_argument, 0, 'k'},
                                         {"top-p", required_argument, 0, 'P'},
                                         {"seed", required_argument, 0, 's'},
                                         {"class", required_argument, 0, 'c'},
                                         {"tenant", required_argument, 0, 'T'},
                                         {"deadline-ms", required_argument, 0, 'd'},
                                         {"socket", required_argument, 0, 'X'},
                                         {"stats", no_argument, 0, 'A'},
                                         {"help", no_argument, 0, 'h'},
                                         {"prompt-ids", required_argument, 0, 'I'},
                                         {"ignore-stop", no_argument, 0, 'G'},
                                         {"ignore-eos", no_argument, 0, 'G'},
                                         {"logit-bias", required_argument, 0, 'B'},
                                         {"repetition-penalty", required_argument, 0, 'R'},
                                         {"presence-penalty", required_argument, 0, 'E'},
                                         {"frequency-penalty", required_argument, 0, 'F'},
                                         {"min-p", required_argument, 0, 'M'},
                                         {"stop-token-ids", required_argument, 0, 'O'},
                                         {"json-schema", required_argument, 0, 'J'},
                                         {"json-object", no_argument, 0, 'j'},
                                         {"regex", required_argument, 0, 'x'},
                                         {"choice", required_argument, 0, 'C'},
                                         {"grammar", required_argument, 0, 'g'},
                                         {"n", required_argument, 0, 'N'},
                                         {0, 0, 0, 0}};
    /* The sampling extensions; their ranges are the library's check (its detail is printed). */
    ringlm_sampling smp;
    ringlm_sampling_init(&smp);
    ringlm_logit_bias *bias = NULL;
    int32_t *stop_ids = NULL;
    char *constraint = NULL;
    size_t clen = 0;
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "p:z:n:t:k:s:c:h", opts, NULL)) != -1) {
        switch (o) {
        case 'p': prompt = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'n': max_tokens = cli_parse_long("--max-tokens", optarg, 1, 1 << 24); break;
        case 'S': steps = cli_parse_long("--steps", optarg, 1, 1 << 24); break;
        case 't': temperature = cli_parse_double("--temperature", optarg, 0, 100); break;
        case 'k': top_k = cli_parse_long("--top-k", optarg, 0, 1 << 30); break;
        case 'P': top_p = cli_parse_double("--top-p", optarg, 1e-9, 1); break;
        case 's': seed = (unsigned long long)cli_parse_long("--seed", optarg, 0, LONG_MAX); break;
        case 'c': cls = optarg; break;
        case 'T': tenant = optarg; break;
        case 'd': deadline_ms = cli_parse_long("--deadline-ms", optarg, 0, 1L << 40); break;
        case 'X': cli_socket = optarg; break;
        case 'A': stats = true; break;
        case 'I': prompt_ids = optarg; break;
        case 'G': ignore_stop = true; break;
        case 'B': bias = parse_bias(optarg, &smp.n_logit_bias); break;
        case 'R':
            smp.repetition_penalty =
                (float)cli_parse_double("--repetition-penalty", optarg, -1e9, 1e9);
            break;
        case 'E':
            smp.presence_penalty = (float)cli_parse_double("--presence-penalty", optarg, -1e9, 1e9);
            break;
        case 'F':
            smp.frequency_penalty =
                (float)cli_parse_double("--frequency-penalty", optarg, -1e9, 1e9);
            break;
        case 'M': smp.min_p = (float)cli_parse_double("--min-p", optarg, -1e9, 1e9); break;
        case 'O': stop_ids = parse_ids("--stop-token-ids", optarg, &smp.n_stop_token_ids); break;
        case 'J':
            constraint = read_whole("--json-schema", optarg, &clen);
            set_constraint(&smp, RINGLM_CONSTRAINT_JSON_SCHEMA, constraint, clen, "--json-schema");
            break;
        case 'j':
            set_constraint(&smp, RINGLM_CONSTRAINT_JSON_OBJECT, NULL, 0, "--json-object");
            break;
        case 'x':
            constraint = cli_strdup(optarg);
            set_constraint(&smp, RINGLM_CONSTRAINT_REGEX, constraint, strlen(optarg), "--regex");
            break;
        case 'C':
            constraint = parse_choice(optarg, &clen);
            set_constraint(&smp, RINGLM_CONSTRAINT_CHOICE, constraint, clen, "--choice");
            break;
        case 'g':
            constraint = read_whole("--grammar", optarg, &clen);
            set_constraint(&smp, RINGLM_CONSTRAINT_GRAMMAR, constraint, clen, "--grammar");
            break;
        case 'N': smp.n = (uint32_t)cli_parse_long("--n", optarg, 1, RINGLM_MAX_N); break;
        case 'h': usage_generate(stdout); return 0;
        default: usage_generate(stderr); return 2;
        }
    }
    if (optind < argc) cli_die("generate: unexpected argument '%s'", argv[optind]);
    if (!prompt) prompt = "";
    ringlm_tokenizer *tok = NULL;
    int32_t *ids;
    int n, rc;
    if (prompt_ids) {
        /* Raw ids: for models without a tokenizer (synthetic weights). */
        size_t cap = 1;
        for (const char *p = prompt_ids; *p; p++) cap += *p == ',';
        ids = malloc(cap * sizeof *ids);
        if (!ids) cli_die("out of memory");
        n = 0;
        char *dup = cli_strdup(prompt_ids), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
            ids[n++] = (int32_t)cli_parse_long("--prompt-ids", t, 0, INT32_MAX);
        free(dup);
        if (n == 0) cli_die("--prompt-ids: no ids");
    } else {
        if (!tok_path) {
            usage_generate(stderr);
            cli_die("generate: --tokenizer FILE is required (e.g. ../shared/models/tok512.bin)");
        }
        rc = ringlm_tokenizer_load(tok_path, 0, &tok);
        if (rc < 0) cli_die("tokenizer %s: %s (%s)", tok_path, strerror(-rc), ringlm_errdetail());
        size_t cap = ringlm_tokenize_bound(prompt);
        ids = malloc(cap * sizeof *ids);
        if (!ids) cli_die("out of memory");
        /* BOS and EOS as the file says (llama.cpp's add_special), BOS for "" as run.c */
        n = ringlm_tokenize(
            tok, prompt, RINGLM_TOKENIZE_SPECIAL | (*prompt ? 0 : RINGLM_TOKENIZE_BOS), ids, cap);
        if (n < 0) cli_die("encoding the prompt: %s", ringlm_errdetail());
    }
    if (steps > 0) {
        /* run.c: positions 0..steps-1, the prompt forced for the first n-1 of them. */
        if (steps < n) cli_die("--steps %ld is shorter than the prompt (%d tokens)", steps, n);
        max_tokens = steps - n + 1;
    }
    if (max_tokens < 0) {
        /* 256, within the model's context where its file states one (the daemon refuses a
         * request whose prompt and max_tokens do not fit) */
        max_tokens = 256;
        int ctx = tok ? ringlm_tokenizer_context_length(tok) : 0;
        if (ctx > 0 && n > ctx)
            cli_die("the prompt is %d tokens, more than the model's context of %d (%s)", n, ctx,
                    tok_path);
        if (ctx > 0 && max_tokens > ctx + 1 - n) max_tokens = ctx + 1 - n;
    }

    ringlm_client *c = cli_connect();
    ringlm_request r;
    ringlm_request_init(&r);
    r.prompt = ids;
    r.n_prompt = (uint32_t)n;
    r.max_new_tokens = (uint32_t)max_tokens;
    r.temperature = (float)temperature;
    r.top_k = (uint32_t)top_k;
    r.top_p = (float)top_p;
    r.seed = seed;
    r.deadline_us = (uint64_t)deadline_ms * 1000u;
    if (cls) r.class_name = cls;
    r.tenant_tag = tenant;
    r.ignore_stop = ignore_stop;
    uint64_t id;
    uint64_t t0 = cli_now_us(), t_first = 0;
    smp.logit_bias = bias;
    smp.stop_token_ids = stop_ids;
    rc = ringlm_submit_ext(c, &r, &smp, &id);
    if (rc < 0)
        cli_die("submit: %s%s%s", ringlm_strerror(rc), *ringlm_errdetail() ? " — " : "",
                ringlm_errdetail());

    if (smp.n > 1) {
        int ec = generate_samples(c, tok, ids, n, id, smp.n, stats, t0);
        ringlm_close(c);
        free(ids);
        free(bias);
        free(stop_ids);
        free(constraint);
        ringlm_tokenizer_free(tok);
        return ec;
    }

    /* The prompt as run.c prints it: each forced token decoded after its predecessor. */
    const char *piece;
    if (tok)
        for (int i = 1; i < n; i++)
            if (ringlm_token_text(tok, ids[i - 1], ids[i], &piece) == 0)
                fputs(run_c_printable(piece), stdout);
    fflush(stdout);
    int32_t prev = ids[n - 1];
    uint32_t got = 0;
    bool stopped_on_bos = false;
    int exit_code = 0;
    for (;;) {
        ringlm_event ev;
        rc = ringlm_next_event(c, &ev, -1);
        if (rc == -EINTR) continue;
        if (rc < 0) {
            fputc('\n', stdout);
            fflush(stdout);
            cli_die("the daemon went away mid-request: %s%s%s", ringlm_strerror(rc),
                    *ringlm_errdetail() ? " — " : "", ringlm_errdetail());
        }
        if (ev.req_id != id) continue;
        if (ev.kind == RINGLM_EV_TOKEN) {
            if (stopped_on_bos) continue;
            if (!got++) t_first = cli_now_us();
            /* run.c stops when it samples BOS and prints nothing for it. */
            if (tok && ev.token == ringlm_tokenizer_bos(tok)) {
                stopped_on_bos = true;
                ringlm_cancel(c, id);
                continue;
            }
            if (!tok) {
                printf("%d\n", ev.token);
                fflush(stdout);
                continue;
            }
            if (ringlm_token_text(tok, prev, ev.token, &piece) < 0) {
                fputc('\n', stdout);
                cli_die("the daemon sent token id %d, outside the tokenizer's %d pieces", ev.token,
                        ringlm_tokenizer_vocab_size(tok));
            }
            fputs(run_c_printable(piece), stdout);
            fflush(stdout);
            prev = ev.token;
        } else if (ev.kind == RINGLM_EV_FINISH) {
            if (tok) fputc('\n', stdout);
            fflush(stdout);
            int fr = ev.finish_reason;
            if (fr == RINGLM_FINISH_REJECTED || fr == RINGLM_FINISH_ERROR ||
                fr == RINGLM_FINISH_TIMEOUT || (fr == RINGLM_FINISH_CANCELLED && !stopped_on_bos)) {
                const char *why = ringlm_event_detail(c);
                fprintf(stderr, "ringlm: request %s%s%s after %u tokens%s%s\n",
                        ringlm_reason_name(fr), ev.reject_reason ? ": " : "",
                        ev.reject_reason ? ringlm_reason_name(ev.reject_reason) : "", ev.n_tokens,
                        why ? " — " : "", why ? why : "");
                exit_code = 1;
            }
            if (stats) {
                uint64_t t_end = cli_now_us();
                fprintf(stderr,
                        "ringlm: %u prompt tokens (%u cached), %u generated, ttft %.2f ms, "
                        "%.2f ms/token, total %.2f ms, finish %s, policy %016llx\n",
                        (unsigned)n, ev.n_cached_tokens, got,
                        t_first ? (double)(t_first - t0) / 1e3 : 0.0,
                        got > 1 ? (double)(t_end - t_first) / 1e3 / (got - 1) : 0.0,
                        (double)(t_end - t0) / 1e3,
                        stopped_on_bos ? "stop" : ringlm_reason_name(fr),
                        (unsigned long long)ev.policy_hash);
            }
            break;
        }
    }
    ringlm_close(c);
    free(ids);
    free(bias);
    free(stop_ids);
    free(constraint);
    ringlm_tokenizer_free(tok);
    return exit_code;
}

/* ======================================================================================= */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ringlm [--socket PATH] COMMAND [options]\n"
            "  generate   stream text for a prompt (ringlm generate --help)\n"
            "  replay     open-loop replay of a trace against the daemon (ringlm replay --help)\n"
            "  version    print the client version\n"
            "--socket PATH: the daemon's socket (default $%s, else %s)\n",
            RINGLM_SOCKET_ENV, RINGLM_DEFAULT_SOCKET);
}

int main(int argc, char **argv)
{
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            cli_socket = argv[i + 1];
            i += 2;
        } else if (!strncmp(argv[i], "--socket=", 9)) {
            cli_socket = argv[i] + 9;
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("ringlm %s\n", RINGLM_VERSION);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i];
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - i, argv + i);
    if (!strcmp(cmd, "replay")) return replay_main(argc - i, argv + i);
    if (!strcmp(cmd, "version")) {
        printf("ringlm %s (libringlm %s)\n", RINGLM_VERSION, ringlm_version(NULL));
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ringlm: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
