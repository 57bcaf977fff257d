/* ringlm — simulator policy search: its reports (the Pareto-front table, JSON, the gnuplot
 * scatter), the tuned policy file, and ringlm-sim --tune.  SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sim/err.h"
#include "sim/report.h"
#include "sim/tune.h"

/* ---- reports -------------------------------------------------------------------------- */

static void loads_text(const sim_tune_result *r, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t l = 0; l < r->n_loads && o < len; l++)
        o += (size_t)snprintf(buf + o, len - o, "%s×%g", l ? "," : "", r->loads[l]);
}

static void window_text(const sim_tune_result *r, int k, char *buf, size_t len)
{
    if (r->window_s[k][1] < 0)
        snprintf(buf, len, "whole trace");
    else
        snprintf(buf, len, "[%.0f s, %.0f s)", r->window_s[k][0], r->window_s[k][1]);
}

void sim_tune_table(FILE *f, const sim_tune_result *r)
{
    char lt[128], w0[64], w1[64];
    loads_text(r, lt, sizeof lt);
    window_text(r, 0, w0, sizeof w0);
    window_text(r, 1, w1, sizeof w1);
    fprintf(f, "tune %s at loads %s, service %s, base policy %s\n", r->trace, lt, r->service,
            r->base_name);
    fprintf(f, "spec %s\n", r->spec);
    fprintf(f,
            "coordinate search: %d pass(es), %zu candidates on %s (%zu of them pairwise moves, %zu "
            "taken); "
            "%zu on %s; %zu on the whole trace; %zu simulations on %d threads in %.1f s\n",
            r->rounds, r->evaluated[0], w0, r->pair_evaluated, r->pair_moves, r->evaluated[1], w1,
            r->evaluated[2], r->runs, r->jobs, r->wall_s);
    fprintf(f,
            "objective: goodput at SLO summed over the loads; constraint: every tenant >= %.2f of "
            "its fair share%s%s\n\n",
            r->fair_floor, r->slo_min > 0 ? ", accepted requests meeting their targets" : "",
            r->scenarios ? ", the DESIGN §7 scenarios and overload at ×4 PASS" : "");
    if (r->slo_min > 0) fprintf(f, "  (accepted-SLO floor %.2f)\n\n", r->slo_min);
    fprintf(f, "%-4s %-16s %12s %12s %12s %9s %9s  %s\n", "", "policy hash", "goodput r/s",
            "TTFT p99 ms", "TPOT p99 ms", "refused", "min fair", "knobs");
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->n_cands; i++) {
            const sim_tune_cand *c = &r->cands[i];
            const sim_tune_score *s = &c->rung[2];
            if (!s->done) continue;
            bool front = c->pareto || i == r->best;
            if (pass == 0 ? !front : (front || !c->is_base)) continue;
            const char *tag = i == r->best ? "best" : c->is_base ? "base" : c->pareto ? "pf" : "";
            fprintf(f, "%-4s %-16s %12.2f %12.1f %12.2f %8.1f%% %9.3f  %s%s\n", tag, c->hash,
                    s->goodput_rps, s->ttft_p99_ms, s->tpot_p99_ms,
                    s->requests ? 100.0 * (double)s->refused / (double)s->requests : 0, s->min_fair,
                    c->values, s->feasible ? "" : " [infeasible]");
            if (c->scenario_failed[0]) fprintf(f, "     scenario failed: %s\n", c->scenario_failed);
        }
    fprintf(f, "\n(pf: on the Pareto front of goodput, TTFT p99, TPOT p99 and refusals among the "
               "whole-trace runs; "
               "figures summed or worst over the loads)\n\nbest per load:\n");
    const sim_tune_cand *b = &r->cands[r->best], *base = &r->cands[r->base];
    fprintf(f, "%-6s %10s %14s %10s %10s %12s %12s %9s %9s\n", "load", "offered", "goodput best",
            "base", "bound", "SLO best", "TTFT99 best", "refused", "min fair");
    for (size_t l = 0; l < r->n_loads; l++) {
        const sim_tune_load *m = &b->rung[2].load[l], *mb = &base->rung[2].load[l];
        fprintf(f, "×%-5g %10.2f %14.2f %10.2f %10.2f %11.1f%% %12.1f %8.1f%% %9.3f\n", r->loads[l],
                m->offered_rps, m->goodput_rps, mb->goodput_rps, r->bound_rps[l],
                100 * m->slo_attainment, m->ttft_p99_ms,
                m->requests ? 100.0 * (double)m->refused / (double)m->requests : 0, m->min_fair);
    }
}

static json_t *score_json(const sim_tune_result *r, const sim_tune_score *s)
{
    json_t *loads = json_array();
    for (size_t l = 0; l < r->n_loads; l++) {
        const sim_tune_load *m = &s->load[l];
        json_array_append_new(
            loads, json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:f,s:s}", "load",
                             r->loads[l], "offered_rps", m->offered_rps, "goodput_rps",
                             m->goodput_rps, "slo_attainment", m->slo_attainment, "accepted_slo",
                             m->accepted_slo, "ttft_p99_ms", m->ttft_p99_ms, "tpot_p99_ms",
                             m->tpot_p99_ms, "requests", (json_int_t)m->requests, "refused",
                             (json_int_t)m->refused, "pending", (json_int_t)m->pending,
                             "min_fair_share", m->min_fair, "min_fair_tenant", m->min_fair_tenant));
    }
    return json_pack("{s:b,s:f,s:f,s:f,s:f,s:I,s:f,s:o}", "feasible", s->feasible, "violation",
                     s->violation, "goodput_rps", s->goodput_rps, "ttft_p99_ms", s->ttft_p99_ms,
                     "tpot_p99_ms", s->tpot_p99_ms, "refused", (json_int_t)s->refused,
                     "min_fair_share", s->min_fair, "loads", loads);
}

static json_t *cand_json(const sim_tune_result *r, const sim_tune_cand *c)
{
    json_t *o =
        json_pack("{s:s,s:b,s:b}", "hash", c->hash, "base", c->is_base, "pareto", c->pareto);
    if (c->scenarios_judged) {
        json_object_set_new(o, "scenarios_passed", json_integer(c->scenarios_passed));
        if (c->scenario_failed[0])
            json_object_set_new(o, "scenario_failed", json_string(c->scenario_failed));
    }
    json_t *vals = json_object();
    if (c->idx)
        for (size_t k = 0; k < r->n_knobs; k++)
            json_object_set_new(vals, r->knobs[k].name, json_string(r->knobs[k].values[c->idx[k]]));
    json_object_set_new(o, "values", vals);
    static const char *const names[SIM_TUNE_RUNGS] = {"screen", "window", "full"};
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        if (c->rung[k].done) json_object_set_new(o, names[k], score_json(r, &c->rung[k]));
    return o;
}

json_t *sim_tune_json(const sim_tune_result *r)
{
    json_t *loads = json_array(), *knobs = json_array(), *cands = json_array(),
           *front = json_array();
    json_t *bounds = json_array();
    for (size_t l = 0; l < r->n_loads; l++) {
        json_array_append_new(loads, json_real(r->loads[l]));
        json_array_append_new(bounds,
                              isnan(r->bound_rps[l]) ? json_null() : json_real(r->bound_rps[l]));
    }
    for (size_t k = 0; k < r->n_knobs; k++) {
        json_t *v = json_array();
        for (size_t i = 0; i < r->knobs[k].n_values; i++)
            json_array_append_new(v, json_string(r->knobs[k].values[i]));
        json_array_append_new(knobs, json_pack("{s:s,s:o}", "name", r->knobs[k].name, "values", v));
    }
    for (size_t i = 0; i < r->n_cands; i++) {
        json_array_append_new(cands, cand_json(r, &r->cands[i]));
        if (r->cands[i].pareto) json_array_append_new(front, json_string(r->cands[i].hash));
    }
    json_t *windows = json_array();
    for (int k = 0; k < SIM_TUNE_RUNGS; k++)
        json_array_append_new(windows, json_pack("[f,f]", r->window_s[k][0], r->window_s[k][1]));
    const sim_tune_cand *b = &r->cands[r->best];
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:f,s:f,s:o,s:o,s:{s:I,s:I,s:I,s:I,s:I},s:I,s:i,s:s,"
                     "s:s,s:s,s:O,s:o,s:o}",
                     "trace", r->trace, "service", r->service, "base_policy", r->base_name, "spec",
                     r->spec, "loads", loads, "goodput_bound_rps", bounds, "fair_floor",
                     r->fair_floor, "slo_min", r->slo_min, "knobs", knobs, "windows_s", windows,
                     "evaluated", "screen", (json_int_t)r->evaluated[0], "window",
                     (json_int_t)r->evaluated[1], "full", (json_int_t)r->evaluated[2], "pairwise",
                     (json_int_t)r->pair_evaluated, "pairwise_moves", (json_int_t)r->pair_moves,
                     "simulations", (json_int_t)r->runs, "rounds", r->rounds, "best_hash", b->hash,
                     "best_values", b->values, "best_policy", sched_policy_canonical(b->policy),
                     "best", json_array_get(cands, r->best), "pareto", front, "candidates", cands);
}

int sim_tune_plot(const char *dir, const sim_tune_result *r, FILE *note)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return sim_err_setc(-errno, "%s: %s", dir, strerror(errno));
    char path[1024], gp[1024];
    snprintf(path, sizeof path, "%s/tune.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    /* index 0: whole-trace candidates off the front; 1: the front; 2: the best; 3: the base */
    for (int blk = 0; blk < 4; blk++) {
        fprintf(f, "# %s: goodput_rps ttft_p99_ms tpot_p99_ms refused hash\n",
                blk == 0   ? "dominated"
                : blk == 1 ? "pareto"
                : blk == 2 ? "best"
                           : "base");
        bool any = false;
        for (size_t i = 0; i < r->n_cands; i++) {
            const sim_tune_cand *c = &r->cands[i];
            const sim_tune_score *s = &c->rung[2];
            if (!s->done) continue;
            bool in = blk == 0   ? !c->pareto && !c->is_base
                      : blk == 1 ? c->pareto
                      : blk == 2 ? i == r->best
                                 : c->is_base;
            if (!in) continue;
            fprintf(f, "%.4f %.3f %.3f %zu %s\n", s->goodput_rps, s->ttft_p99_ms, s->tpot_p99_ms,
                    s->refused, c->hash);
            any = true;
        }
        if (!any) fprintf(f, "nan nan nan nan -\n");
        fprintf(f, "\n\n");
    }
    fclose(f);
    snprintf(gp, sizeof gp, "%s/plots-tune.gp", dir);
    if (!(f = fopen(gp, "w"))) return sim_err_setc(-errno, "%s: %s", gp, strerror(errno));
    char lt[128];
    loads_text(r, lt, sizeof lt);
    fprintf(f,
            "# ringlm-sim --tune: whole-trace candidates; run: gnuplot %s\ncd '%s'\nset grid\nset "
            "key top left\n",
            gp, dir);
    const char *terms[2][2] = {{"pngcairo size 1000,600 noenhanced", "png"},
                               {"svg size 1000,600 noenhanced", "svg"}};
    for (int k = 0; k < 2; k++)
        fprintf(
            f,
            "set terminal %s\nset output 'tune-pareto.%s'\nset title 'Policy search on %s at loads "
            "%s'\n"
            "set xlabel 'TTFT p99, worst load (ms)'\nset ylabel 'goodput at SLO, summed over loads "
            "(req/s)'\n"
            "set logscale x\nplot 'tune.dat' index 0 using 2:1 with points pt 6 ps 1.5 title "
            "'candidate', "
            "'' index 1 using 2:1 with linespoints pt 7 ps 1.5 lw 2 title 'Pareto front', "
            "'' index 2 using 2:1 with points pt 3 ps 3 lw 2 title 'best', "
            "'' index 3 using 2:1 with points pt 5 ps 2 title 'base policy'\nunset logscale x\n",
            terms[k][0], terms[k][1], r->trace, lt);
    fclose(f);
    return sim_report_gnuplot(dir, gp, "tune", note);
}

int sim_tune_write_policy(const char *path, const sim_tune_result *r)
{
    const sim_tune_cand *b = &r->cands[r->best];
    FILE *f = fopen(path, "w");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    char lt[128];
    loads_text(r, lt, sizeof lt);
    fprintf(f, "# tuned by ringlm-sim --tune on %s at loads %s (service: %s), base policy %s\n",
            r->trace, lt, r->service, r->base_name);
    fprintf(f, "# searched: %s\n", r->spec);
    fprintf(f, "# chosen: %s\n", b->values);
    fprintf(f,
            "# goodput at SLO %.2f req/s summed over the loads (base policy: %.2f); every tenant "
            ">= %.2f of its fair share%s\n",
            b->rung[2].goodput_rps, r->cands[r->base].rung[2].goodput_rps, r->fair_floor,
            r->scenarios ? b->rung[2].feasible ? "; the DESIGN §7 scenarios and overload at ×4 PASS"
                                               : "; NOT feasible"
                         : "");
    fprintf(f, "# policy hash %s\n%s", b->hash, sched_policy_canonical(b->policy));
    if (fclose(f) != 0) return sim_err_setc(-EIO, "%s: write error", path);
    return 0;
}

int sim_tune_cli(const sim_trace *t, const sched_policy *base, const sim_tune_opts *o, bool json,
                 const char *plot_dir, const char *out_path)
{
    sim_tune_result r;
    int rc = sim_tune(t, base, o, &r);
    if (rc < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        return 1;
    }
    int status = 0;
    if (json) {
        json_t *j = sim_tune_json(&r);
        json_object_set_new(j, "policy_file", json_string(out_path));
        char *s = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10))
                    : NULL;
        if (s) {
            fputs(s, stdout);
            fputc('\n', stdout);
            free(s);
        } else
            status = 1;
        json_decref(j);
    } else {
        sim_tune_table(stdout, &r);
    }
    if (plot_dir && (rc = sim_tune_plot(plot_dir, &r, stderr)) < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        status = 1;
    }
    if ((rc = sim_tune_write_policy(out_path, &r)) < 0) {
        fprintf(stderr, "ringlm-sim: %s\n", sim_err());
        status = 1;
    } else if (!json) {
        printf("\nbest policy written to %s (hash %s)\n", out_path, r.cands[r.best].hash);
    }
    sim_tune_result_free(&r);
    return status;
}
