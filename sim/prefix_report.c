/* ringlm — simulator: the prefix cache's report (see prefix_report.h). SPDX-License-Identifier: MIT */
#include "sim/prefix_report.h"
#include "sim/err.h"
#include "sim/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void sim_prefix_figures_of(const sim_run *r, sim_prefix_figures *f)
{
    const sched_counts *c = &r->final_counts;
    memset(f, 0, sizeof *f);
    f->query_tokens = c->prefix_query_tokens;
    f->hit_tokens = c->prefix_hit_tokens;
    f->self_tokens = c->prefix_self_tokens;
    f->cross_tokens = c->prefix_hit_tokens - c->prefix_self_tokens;
    f->evicted_blocks = c->prefix_evicted_blocks;
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        f->hit_tokens_tier[p] = c->prefix_hit_pool_tokens[p];
        f->demoted_blocks[p] = c->prefix_demoted_blocks[p];
        f->reloaded_blocks[p] = c->prefix_reloaded_blocks[p];
        f->recomputed_blocks[p] = c->prefix_recomputed_blocks[p];
    }
    f->copy_wait_ms = r->cache_copy_wait_us / 1000;
    f->prefill_tokens = r->prefill_tokens;
    f->hit_rate = f->query_tokens ? (double)f->hit_tokens / (double)f->query_tokens : 0;
    f->recorded_hit_tokens = -1;
    for (size_t i = 0; r->trace && i < r->trace->n; i++)
        if (r->trace->reqs[i].real_cached_tokens >= 0)
            f->recorded_hit_tokens = (f->recorded_hit_tokens < 0 ? 0 : f->recorded_hit_tokens) +
                                     r->trace->reqs[i].real_cached_tokens;
}

json_t *sim_prefix_json(const sim_prefix_figures *f)
{
    json_t *tiers = json_object(), *dem = json_object(), *rel = json_object(), *rec = json_object();
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        const char *n = sched_pool_name((sched_pool)p);
        json_object_set_new(tiers, n, json_integer((json_int_t)f->hit_tokens_tier[p]));
        if (p == SCHED_POOL_DEVICE) continue;
        json_object_set_new(dem, n, json_integer((json_int_t)f->demoted_blocks[p]));
        json_object_set_new(rel, n, json_integer((json_int_t)f->reloaded_blocks[p]));
        json_object_set_new(rec, n, json_integer((json_int_t)f->recomputed_blocks[p]));
    }
    json_t *o = json_pack("{s:I,s:I,s:I,s:I,s:f,s:o,s:I,s:I}", "query_tokens", (json_int_t)f->query_tokens,
                          "hit_tokens", (json_int_t)f->hit_tokens, "cross_tokens", (json_int_t)f->cross_tokens,
                          "self_tokens", (json_int_t)f->self_tokens, "hit_rate", f->hit_rate, "hit_tokens_by_tier", tiers,
                          "evicted_blocks", (json_int_t)f->evicted_blocks, "prefill_tokens", (json_int_t)f->prefill_tokens);
    json_object_set_new(o, "demoted_blocks", dem);
    json_object_set_new(o, "reloaded_blocks", rel);
    json_object_set_new(o, "recomputed_blocks", rec);
    json_object_set_new(o, "copy_wait_ms", json_real(f->copy_wait_ms));
    /* a replayed request log of a real run: what that run found cached, next to the replay's */
    if (o && f->recorded_hit_tokens >= 0)
        json_object_set_new(o, "recorded_hit_tokens", json_integer((json_int_t)f->recorded_hit_tokens));
    return o;
}

typedef struct point {
    bool     cache;
    uint32_t blocks;
    sim_prefix_figures fig;
    sim_dist ttft, e2e;
    double   tokens_per_s;
} point;

static int run_point(const sim_trace *t, const sim_options *base, bool cache, uint32_t blocks, point *pt)
{
    sim_options o = *base;
    o.prefix_cache = cache;
    o.kv_blocks_device = blocks;
    o.decision_log = NULL;
    sim_run r;
    sim_summary s;
    memset(&s, 0, sizeof s);
    int rc = sim_run_trace(t, &o, &r);
    if (rc == 0) rc = sim_summarise(&r, NULL, -1, -1, &s);
    if (rc == 0) {
        pt->cache = cache;
        pt->blocks = blocks ? blocks : r.final_counts.kv_total[SCHED_POOL_DEVICE];
        sim_prefix_figures_of(&r, &pt->fig);
        pt->ttft = s.all.ttft;
        pt->e2e = s.all.e2e;
        pt->tokens_per_s = s.tokens_per_s;
    }
    sim_summary_free(&s);
    sim_run_free(&r);
    return rc;
}

static json_t *point_json(const point *p)
{
    json_t *o = json_pack("{s:b,s:I,s:f,s:f,s:f,s:f}", "cache", p->cache, "device_blocks", (json_int_t)p->blocks,
                          "ttft_p50_ms", p->ttft.p50, "ttft_p99_ms", p->ttft.p99, "e2e_p50_ms", p->e2e.p50,
                          "tokens_per_s", p->tokens_per_s);
    json_object_set_new(o, "prefix_cache", sim_prefix_json(&p->fig));
    return o;
}

static void sweep_plot(const char *dir, const point *pts, size_t n, FILE *note)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/prefix-sweep.dat", dir);
    FILE *d = fopen(path, "w");
    if (!d) { fprintf(note, "ringlm-sim: %s: %s\n", path, strerror(errno)); return; }
    for (size_t i = 0; i < n; i++)
        fprintf(d, "%u %.4f %.3f\n", pts[i].blocks, 100 * pts[i].fig.hit_rate, pts[i].ttft.p50);
    fclose(d);
    char gp[4096];
    snprintf(gp, sizeof gp,
             "set xlabel 'device KV blocks'\nset ylabel 'prefix hit rate (%% of prompt tokens)'\n"
             "set y2label 'TTFT p50 (ms)'\nset y2tics\nset ytics nomirror\nset logscale x 2\nset grid\n"
             "set key bottom right\n"
             "plot '%s' using 1:2 with linespoints title 'hit rate', '%s' using 1:3 axes x1y2 with linespoints title 'TTFT p50'\n",
             path, path);
    sim_report_gnuplot(dir, gp, "prefix-sweep", note);
}

int sim_prefix_report(FILE *f, bool json, const sim_trace *t, const sim_options *o,
                      const uint32_t *sweep, size_t n_sweep, const char *plot_dir)
{
    point off, on, *sw = calloc(n_sweep ? n_sweep : 1, sizeof *sw);
    if (!sw) return -ENOMEM;
    int rc = run_point(t, o, false, o->kv_blocks_device, &off);
    if (!rc) rc = run_point(t, o, true, o->kv_blocks_device, &on);
    for (size_t i = 0; i < n_sweep && !rc; i++) rc = run_point(t, o, true, sweep[i], &sw[i]);
    if (rc) { free(sw); return rc; }
    size_t hashed = 0;
    for (size_t i = 0; i < t->n; i++) hashed += t->reqs[i].n_hash > 0;
    double saved = off.fig.prefill_tokens ? 1 - (double)on.fig.prefill_tokens / (double)off.fig.prefill_tokens : 0;
    double ttft_ratio = on.ttft.p50 > 0 ? off.ttft.p50 / on.ttft.p50 : 0;
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n_sweep; i++) json_array_append_new(arr, point_json(&sw[i]));
        json_t *root = json_pack("{s:s,s:s,s:I,s:I,s:o,s:o,s:f,s:f,s:o}", "trace", t->source, "policy",
                                 o->policy_name ? o->policy_name : "default", "requests", (json_int_t)t->n,
                                 "requests_with_block_hashes", (json_int_t)hashed, "off", point_json(&off), "on",
                                 point_json(&on), "prefill_tokens_saved", saved, "ttft_p50_off_over_on", ttft_ratio,
                                 "capacity_sweep", arr);
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (s) { fputs(s, f); fputc('\n', f); free(s); }
        json_decref(root);
    } else {
        fprintf(f, "prefix cache on %s: %zu requests (%zu with block hashes), policy %s\n\n", t->source, t->n, hashed,
                o->policy_name ? o->policy_name : "default");
        fprintf(f, "%-10s %8s %9s %10s %10s %12s %10s %10s %10s\n", "cache", "blocks", "hit rate", "cross tok",
                "self tok", "prefill tok", "ttft p50", "ttft p99", "e2e p50");
        const point *rows[2] = {&off, &on};
        for (int i = 0; i < 2; i++) {
            const point *p = rows[i];
            fprintf(f, "%-10s %8u %8.1f%% %10llu %10llu %12llu %8.1fms %8.1fms %8.1fms\n", p->cache ? "on" : "off",
                    p->blocks, 100 * p->fig.hit_rate, (unsigned long long)p->fig.cross_tokens,
                    (unsigned long long)p->fig.self_tokens, (unsigned long long)p->fig.prefill_tokens, p->ttft.p50,
                    p->ttft.p99, p->e2e.p50);
        }
        fprintf(f, "\nprefill tokens saved %.1f%%; TTFT p50 %.2fx lower with the cache; hits by tier: device %llu, "
                   "host %llu, disk %llu tokens (host and disk ones reloaded)\n",
                100 * saved, ttft_ratio, (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_DEVICE],
                (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_HOST],
                (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_DISK]);
        if (on.fig.demoted_blocks[SCHED_POOL_HOST] || on.fig.demoted_blocks[SCHED_POOL_DISK])
            fprintf(f, "tiers: blocks demoted host %llu, disk %llu; reloaded host %llu, disk %llu; recomputed instead "
                       "host %llu, disk %llu; steps waited %.1f ms for cache copies\n",
                    (unsigned long long)on.fig.demoted_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.demoted_blocks[SCHED_POOL_DISK],
                    (unsigned long long)on.fig.reloaded_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.reloaded_blocks[SCHED_POOL_DISK],
                    (unsigned long long)on.fig.recomputed_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.recomputed_blocks[SCHED_POOL_DISK], on.fig.copy_wait_ms);
        if (n_sweep) {
            fprintf(f, "\ncapacity sweep (cache on)\n%8s %9s %12s %10s %10s\n", "blocks", "hit rate", "prefill tok",
                    "ttft p50", "evicted");
            for (size_t i = 0; i < n_sweep; i++)
                fprintf(f, "%8u %8.1f%% %12llu %8.1fms %10llu\n", sw[i].blocks, 100 * sw[i].fig.hit_rate,
                        (unsigned long long)sw[i].fig.prefill_tokens, sw[i].ttft.p50,
                        (unsigned long long)sw[i].fig.evicted_blocks);
        }
    }
    if (plot_dir && n_sweep) sweep_plot(plot_dir, sw, n_sweep, stderr);
    free(sw);
    return 0;
}
