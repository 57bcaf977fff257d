/* ringlm — simulator: the prefix cache's report (see prefix_report.h). SPDX-License-Identifier: MIT */
#include "sim/prefix_report.h"
#include "sim/err.h"
#include "sim/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
        f->cross_tokens_tier[p] = c->prefix_hit_pool_tokens[p] - c->prefix_self_pool_tokens[p];
        f->demoted_blocks[p] = c->prefix_demoted_blocks[p];
        f->reloaded_blocks[p] = c->prefix_reloaded_blocks[p];
        f->recomputed_blocks[p] = c->prefix_recomputed_blocks[p];
    }
    f->copy_wait_ms = r->cache_copy_wait_us / 1000;
    f->prefill_tokens = r->prefill_tokens;
    f->hit_rate = f->query_tokens ? (double)f->hit_tokens / (double)f->query_tokens : 0;
    for (size_t i = 0; r->trace && i < r->trace->n; i++)
        if (r->trace->reqs[i].n_hash) f->prompt_tokens += r->trace->reqs[i].prompt_tokens;
    for (size_t i = 0; i < r->n_recs; i++) f->prompt_hit_tokens += r->recs[i].cached_tokens;
    f->prompt_hit_rate =
        f->prompt_tokens ? (double)f->prompt_hit_tokens / (double)f->prompt_tokens : 0;
    f->recorded_hit_tokens = -1;
    for (size_t i = 0; r->trace && i < r->trace->n; i++)
        if (r->trace->reqs[i].real_cached_tokens >= 0)
            f->recorded_hit_tokens = (f->recorded_hit_tokens < 0 ? 0 : f->recorded_hit_tokens) +
                                     r->trace->reqs[i].real_cached_tokens;
}

json_t *sim_prefix_json(const sim_prefix_figures *f)
{
    json_t *tiers = json_object(), *dem = json_object(), *rel = json_object(), *rec = json_object();
    json_t *ctiers = json_object();
    for (int p = 0; p < SCHED_POOL__COUNT; p++) {
        const char *n = sched_pool_name((sched_pool)p);
        json_object_set_new(tiers, n, json_integer((json_int_t)f->hit_tokens_tier[p]));
        json_object_set_new(ctiers, n, json_integer((json_int_t)f->cross_tokens_tier[p]));
        if (p == SCHED_POOL_DEVICE) continue;
        json_object_set_new(dem, n, json_integer((json_int_t)f->demoted_blocks[p]));
        json_object_set_new(rel, n, json_integer((json_int_t)f->reloaded_blocks[p]));
        json_object_set_new(rec, n, json_integer((json_int_t)f->recomputed_blocks[p]));
    }
    json_t *o =
        json_pack("{s:I,s:I,s:I,s:I,s:f,s:o,s:I,s:I}", "query_tokens", (json_int_t)f->query_tokens,
                  "hit_tokens", (json_int_t)f->hit_tokens, "cross_tokens",
                  (json_int_t)f->cross_tokens, "self_tokens", (json_int_t)f->self_tokens,
                  "hit_rate", f->hit_rate, "hit_tokens_by_tier", tiers, "evicted_blocks",
                  (json_int_t)f->evicted_blocks, "prefill_tokens", (json_int_t)f->prefill_tokens);
    json_object_set_new(o, "cross_tokens_by_tier", ctiers);
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)f->prompt_tokens));
    json_object_set_new(o, "prompt_hit_tokens", json_integer((json_int_t)f->prompt_hit_tokens));
    json_object_set_new(o, "prompt_hit_rate", json_real(f->prompt_hit_rate));
    json_object_set_new(o, "demoted_blocks", dem);
    json_object_set_new(o, "reloaded_blocks", rel);
    json_object_set_new(o, "recomputed_blocks", rec);
    json_object_set_new(o, "copy_wait_ms", json_real(f->copy_wait_ms));
    /* a replayed request log of a real run: what that run found cached, next to the replay's */
    if (o && f->recorded_hit_tokens >= 0)
        json_object_set_new(o, "recorded_hit_tokens",
                            json_integer((json_int_t)f->recorded_hit_tokens));
    return o;
}

typedef struct point {
    bool cache;
    uint32_t blocks, host_blocks, disk_blocks; /* device, host and disk pools of the run */
    sim_prefix_figures fig;
    sim_dist ttft, e2e;
    double tokens_per_s;
} point;

/* One run of the trace: the cache on or off, `blocks` device blocks (0: the model's), host
 * and disk tiers of `host` and `disk` blocks (< 0: the model's, as --host-kv-blocks and
 * --disk-kv-blocks would set them). */
static int run_point(const sim_trace *t, const sim_options *base, bool cache, uint32_t blocks,
                     long long host, long long disk, point *pt)
{
    sim_options o = *base;
    sim_service svc = *base->svc; /* a shallow copy: only its tier sizes change */
    sim_service_set_tiers(&svc, host, disk, 0, 0);
    o.svc = &svc;
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
        pt->host_blocks = r.final_counts.kv_total[SCHED_POOL_HOST];
        pt->disk_blocks = r.final_counts.kv_total[SCHED_POOL_DISK];
        sim_prefix_figures_of(&r, &pt->fig);
        pt->ttft = s.all.ttft;
        pt->e2e = s.all.e2e;
        pt->tokens_per_s = s.tokens_per_s;
    }
    sim_summary_free(&s);
    sim_run_free(&r);
    return rc;
}

static double tier_rate(const point *p, int pool)
{
    return p->fig.query_tokens ? (double)p->fig.hit_tokens_tier[pool] / (double)p->fig.query_tokens
                               : 0;
}

/* Of the hits on other requests' blocks, the share found in pool (0 when none). */
static double cross_share(const point *p, int pool)
{
    return p->fig.cross_tokens
               ? (double)p->fig.cross_tokens_tier[pool] / (double)p->fig.cross_tokens
               : 0;
}

static json_t *point_json(const point *p)
{
    json_t *o =
        json_pack("{s:b,s:I,s:I,s:I,s:f,s:f,s:f,s:f}", "cache", p->cache, "device_blocks",
                  (json_int_t)p->blocks, "host_blocks", (json_int_t)p->host_blocks, "disk_blocks",
                  (json_int_t)p->disk_blocks, "ttft_p50_ms", p->ttft.p50, "ttft_p99_ms",
                  p->ttft.p99, "e2e_p50_ms", p->e2e.p50, "tokens_per_s", p->tokens_per_s);
    json_t *by = json_object();
    for (int q = 0; q < SCHED_POOL__COUNT; q++)
        json_object_set_new(by, sched_pool_name((sched_pool)q), json_real(tier_rate(p, q)));
    json_object_set_new(o, "hit_rate_by_tier", by);
    json_t *cs = json_object();
    for (int q = 0; q < SCHED_POOL__COUNT; q++)
        json_object_set_new(cs, sched_pool_name((sched_pool)q), json_real(cross_share(p, q)));
    json_object_set_new(o, "cross_share_by_tier", cs);
    json_object_set_new(o, "prefix_cache", sim_prefix_json(&p->fig));
    return o;
}

/* The sweep's points come grouped by (host, disk) tiers, device sizes within a group in the
 * order given: one curve per group, the prompt hit rate (what requests found at their first
 * admission) against device blocks; with only one group also where the hits were found and
 * TTFT p50.  Writes DIR/prefix-sweep.{dat,gp,png,svg}. */
static void sweep_plot(const char *dir, const point *pts, size_t n, size_t per_group, FILE *note)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        fprintf(note, "ringlm-sim: %s: %s\n", dir, strerror(errno));
        return;
    }
    char path[1024], gp[1024];
    snprintf(path, sizeof path, "%s/prefix-sweep.dat", dir);
    FILE *d = fopen(path, "w");
    if (!d) {
        fprintf(note, "ringlm-sim: %s: %s\n", path, strerror(errno));
        return;
    }
    size_t groups = n / per_group;
    for (size_t g = 0; g < groups; g++) {
        const point *p0 = &pts[g * per_group];
        fprintf(d,
                "# host %u disk %u: device_blocks prompt_hit_rate_pct cross_hits_on_device_pct "
                "on_host_pct on_disk_pct "
                "ttft_p50_ms\n",
                p0->host_blocks, p0->disk_blocks);
        for (size_t i = 0; i < per_group; i++) {
            const point *p = &p0[i];
            fprintf(d, "%u %.4f %.4f %.4f %.4f %.3f\n", p->blocks, 100 * p->fig.prompt_hit_rate,
                    100 * cross_share(p, SCHED_POOL_DEVICE), 100 * cross_share(p, SCHED_POOL_HOST),
                    100 * cross_share(p, SCHED_POOL_DISK), p->ttft.p50);
        }
        fprintf(d, "\n\n"); /* a gnuplot index per group */
    }
    fclose(d);
    snprintf(gp, sizeof gp, "%s/prefix-sweep.gp", dir);
    FILE *f = fopen(gp, "w");
    if (!f) {
        fprintf(note, "ringlm-sim: %s: %s\n", gp, strerror(errno));
        return;
    }
    fprintf(
        f,
        "# ringlm-sim --capacity-sweep; run: gnuplot %s\ncd '%s'\nset grid\nset key bottom right\n"
        "set xlabel 'device KV blocks'\nset ylabel 'prompt tokens found cached at admission "
        "(%%)'\nset logscale x 2\n"
        "set yrange [0:100]\n",
        gp, dir);
    if (groups == 1) fprintf(f, "set y2label 'TTFT p50 (ms)'\nset y2tics\nset ytics nomirror\n");
    const char *terms[2][2] = {{"pngcairo size 1000,600 noenhanced", "png"},
                               {"svg size 1000,600 noenhanced", "svg"}};
    for (int k = 0; k < 2; k++) {
        fprintf(f,
                "set terminal %s\nset output 'prefix-sweep.%s'\nset title 'Prefix cache hit rate "
                "against device + host + disk "
                "KV blocks'\nplot ",
                terms[k][0], terms[k][1]);
        for (size_t g = 0; g < groups; g++) {
            const point *p0 = &pts[g * per_group];
            fprintf(f,
                    "%s'prefix-sweep.dat' index %zu using 1:2 with linespoints lw 2 title 'host %u "
                    "+ disk %u'",
                    g ? ", " : "", g, p0->host_blocks, p0->disk_blocks);
        }
        if (groups == 1)
            fprintf(f, ", '' index 0 using 1:4 with linespoints title 'share of hits found on "
                       "host', '' index 0 using 1:5 "
                       "with linespoints title 'share found on disk', '' index 0 using 1:6 axes "
                       "x1y2 with linespoints "
                       "title 'TTFT p50'");
        fprintf(f, "\n");
    }
    fclose(f);
    sim_report_gnuplot(dir, gp, "prefix-sweep", note);
}

int sim_prefix_report(FILE *f, bool json, const sim_trace *t, const sim_options *o,
                      const sim_prefix_sweep *sweep, const char *plot_dir)
{
    /* the grid: each host size × each disk size × each device size (an empty list: the run's own) */
    static const sim_prefix_sweep none;
    if (!sweep) sweep = &none;
    bool any = sweep->n_device || sweep->n_host || sweep->n_disk;
    size_t nd = sweep->n_device ? sweep->n_device : 1, nh = sweep->n_host ? sweep->n_host : 1;
    size_t nk = sweep->n_disk ? sweep->n_disk : 1, n_sweep = any ? nd * nh * nk : 0;
    point off, on, *sw = calloc(n_sweep ? n_sweep : 1, sizeof *sw);
    if (!sw) return -ENOMEM;
    int rc = run_point(t, o, false, o->kv_blocks_device, -1, -1, &off);
    if (!rc) rc = run_point(t, o, true, o->kv_blocks_device, -1, -1, &on);
    for (size_t i = 0; i < n_sweep && !rc; i++) {
        size_t h = i / (nd * nk), k = i / nd % nk, dv = i % nd;
        rc = run_point(t, o, true, sweep->n_device ? sweep->device[dv] : o->kv_blocks_device,
                       sweep->n_host ? (long long)sweep->host[h] : -1,
                       sweep->n_disk ? (long long)sweep->disk[k] : -1, &sw[i]);
    }
    if (rc) {
        free(sw);
        return rc;
    }
    size_t hashed = 0;
    for (size_t i = 0; i < t->n; i++) hashed += t->reqs[i].n_hash > 0;
    double saved = off.fig.prefill_tokens
                       ? 1 - (double)on.fig.prefill_tokens / (double)off.fig.prefill_tokens
                       : 0;
    double ttft_ratio = on.ttft.p50 > 0 ? off.ttft.p50 / on.ttft.p50 : 0;
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n_sweep; i++) json_array_append_new(arr, point_json(&sw[i]));
        json_t *root =
            json_pack("{s:s,s:s,s:I,s:I,s:o,s:o,s:f,s:f,s:o}", "trace", t->source, "policy",
                      o->policy_name ? o->policy_name : "default", "requests", (json_int_t)t->n,
                      "requests_with_block_hashes", (json_int_t)hashed, "off", point_json(&off),
                      "on", point_json(&on), "prefill_tokens_saved", saved, "ttft_p50_off_over_on",
                      ttft_ratio, "capacity_sweep", arr);
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (s) {
            fputs(s, f);
            fputc('\n', f);
            free(s);
        }
        json_decref(root);
    } else {
        fprintf(f, "prefix cache on %s: %zu requests (%zu with block hashes), policy %s\n\n",
                t->source, t->n, hashed, o->policy_name ? o->policy_name : "default");
        fprintf(f, "%-10s %8s %9s %10s %10s %12s %10s %10s %10s\n", "cache", "blocks", "hit rate",
                "cross tok", "self tok", "prefill tok", "ttft p50", "ttft p99", "e2e p50");
        const point *rows[2] = {&off, &on};
        for (int i = 0; i < 2; i++) {
            const point *p = rows[i];
            fprintf(f, "%-10s %8u %8.1f%% %10llu %10llu %12llu %8.1fms %8.1fms %8.1fms\n",
                    p->cache ? "on" : "off", p->blocks, 100 * p->fig.hit_rate,
                    (unsigned long long)p->fig.cross_tokens, (unsigned long long)p->fig.self_tokens,
                    (unsigned long long)p->fig.prefill_tokens, p->ttft.p50, p->ttft.p99,
                    p->e2e.p50);
        }
        fprintf(f,
                "\nprefill tokens saved %.1f%%; TTFT p50 %.2fx lower with the cache; hits by tier: "
                "device %llu, "
                "host %llu, disk %llu tokens (host and disk ones reloaded)\n",
                100 * saved, ttft_ratio,
                (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_DEVICE],
                (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_HOST],
                (unsigned long long)on.fig.hit_tokens_tier[SCHED_POOL_DISK]);
        if (on.fig.demoted_blocks[SCHED_POOL_HOST] || on.fig.demoted_blocks[SCHED_POOL_DISK])
            fprintf(f,
                    "tiers: blocks demoted host %llu, disk %llu; reloaded host %llu, disk %llu; "
                    "recomputed instead "
                    "host %llu, disk %llu; steps waited %.1f ms for cache copies\n",
                    (unsigned long long)on.fig.demoted_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.demoted_blocks[SCHED_POOL_DISK],
                    (unsigned long long)on.fig.reloaded_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.reloaded_blocks[SCHED_POOL_DISK],
                    (unsigned long long)on.fig.recomputed_blocks[SCHED_POOL_HOST],
                    (unsigned long long)on.fig.recomputed_blocks[SCHED_POOL_DISK],
                    on.fig.copy_wait_ms);
        if (n_sweep) {
            fprintf(
                f,
                "\ncapacity sweep (cache on) against device + host + disk KV blocks: prompt = "
                "prompt tokens found "
                "cached at first admission; all = every admission's hits (resumed sequences' own "
                "blocks too); "
                "where the hits on other requests' blocks were found; blocks demoted and dropped\n"
                "%8s %8s %8s %8s %8s %8s %8s %8s %12s %10s %8s %8s %9s\n",
                "device", "host", "disk", "prompt", "all", "@device", "@host", "@disk",
                "prefill tok", "ttft p50", "->host", "->disk", "dropped");
            for (size_t i = 0; i < n_sweep; i++)
                fprintf(f,
                        "%8u %8u %8u %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %12llu %8.1fms %8llu "
                        "%8llu %9llu\n",
                        sw[i].blocks, sw[i].host_blocks, sw[i].disk_blocks,
                        100 * sw[i].fig.prompt_hit_rate, 100 * sw[i].fig.hit_rate,
                        100 * cross_share(&sw[i], SCHED_POOL_DEVICE),
                        100 * cross_share(&sw[i], SCHED_POOL_HOST),
                        100 * cross_share(&sw[i], SCHED_POOL_DISK),
                        (unsigned long long)sw[i].fig.prefill_tokens, sw[i].ttft.p50,
                        (unsigned long long)sw[i].fig.demoted_blocks[SCHED_POOL_HOST],
                        (unsigned long long)sw[i].fig.demoted_blocks[SCHED_POOL_DISK],
                        (unsigned long long)sw[i].fig.evicted_blocks);
        }
    }
    if (plot_dir && n_sweep) sweep_plot(plot_dir, sw, n_sweep, nd, stderr);
    free(sw);
    return 0;
}
