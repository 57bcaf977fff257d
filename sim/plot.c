/* ringlm — simulator plots: data files plus a gnuplot script, run when gnuplot is there.
 * SPDX-License-Identifier: MIT */
#include "sim/err.h"
#include "sim/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool have_gnuplot(char *path, size_t len)
{
    const char *p = getenv("PATH");
    if (!p) p = "/usr/bin:/bin";
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", p);
    for (char *d = strtok(buf, ":"); d; d = strtok(NULL, ":")) {
        snprintf(path, len, "%s/gnuplot", d);
        if (access(path, X_OK) == 0) return true;
    }
    return false;
}

/* Write one CDF block per tenant (gnuplot `index`), x = latency ms, y = fraction ≤ x. */
static int write_cdf(FILE *f, const sim_run *r, bool e2e, unsigned *blocks, const char **names)
{
    const sim_trace *t = r->trace;
    double *v = malloc((t->n ? t->n : 1) * sizeof *v);
    if (!v) return -ENOMEM;
    *blocks = 0;
    for (unsigned k = 0; k < t->n_tenants; k++) {
        size_t n = 0;
        for (size_t i = 0; i < t->n; i++) {
            const sim_req *q = &t->reqs[i];
            if (q->tenant != k || r->final_rec[i] == UINT32_MAX) continue;
            const sim_rec *x = &r->recs[r->final_rec[i]];
            if (e2e && x->outcome == SIM_OUT_FINISHED)
                v[n++] = (double)(x->end_us - q->arrival_us) / 1000.0;
            if (!e2e && x->first_token_us >= 0)
                v[n++] = (double)(x->first_token_us - q->arrival_us) / 1000.0;
        }
        if (!n) continue;
        qsort(v, n, sizeof *v, cmp_double);
        fprintf(f, "# tenant %s\n", t->tenants[k]);
        /* at most ~2000 points per curve: enough to draw, small enough to ship */
        size_t stride = n / 2000 + 1;
        for (size_t i = 0; i < n; i += stride)
            fprintf(f, "%.4f %.6f\n", v[i], (double)(i + 1) / (double)n);
        fprintf(f, "%.4f 1\n\n\n", v[n - 1]);
        names[(*blocks)++] = t->tenants[k];
    }
    free(v);
    return 0;
}

/* One CDF block of every request's TTFT or E2E. Returns the number of points (0: none). */
static size_t write_cdf_all(FILE *f, const sim_run *r, bool e2e, const char *label)
{
    const sim_trace *t = r->trace;
    double *v = malloc((t->n ? t->n : 1) * sizeof *v);
    if (!v) return 0;
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (r->final_rec[i] == UINT32_MAX) continue;
        const sim_req *q = &t->reqs[i];
        const sim_rec *x = &r->recs[r->final_rec[i]];
        if (e2e && x->outcome == SIM_OUT_FINISHED)
            v[n++] = (double)(x->end_us - q->arrival_us) / 1000.0;
        if (!e2e && x->first_token_us >= 0)
            v[n++] = (double)(x->first_token_us - q->arrival_us) / 1000.0;
    }
    if (n) {
        qsort(v, n, sizeof *v, cmp_double);
        fprintf(f, "# policy %s\n", label);
        size_t stride = n / 2000 + 1;
        for (size_t i = 0; i < n; i += stride)
            fprintf(f, "%.4f %.6f\n", v[i], (double)(i + 1) / (double)n);
        fprintf(f, "%.4f 1\n", v[n - 1]);
    } else {
        fprintf(f, "# policy %s: none\nnan nan\n", label); /* keeps index numbering aligned */
    }
    fprintf(f, "\n\n");
    free(v);
    return n;
}

static int run_gnuplot(const char *dir, const char *gp, const char *sfx, FILE *note);

int sim_report_plot_compare(const char *dir, const sim_run *const *runs, size_t n, FILE *note)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return sim_err_setc(-errno, "%s: %s", dir, strerror(errno));
    char path[1024], gp[1024];
    for (int which = 0; which < 2; which++) {
        snprintf(path, sizeof path, "%s/compare-%s-cdf.dat", dir, which ? "e2e" : "ttft");
        FILE *f = fopen(path, "w");
        if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
        for (size_t k = 0; k < n; k++) write_cdf_all(f, runs[k], which, runs[k]->policy_name);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/compare-queue.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    for (size_t k = 0; k < n; k++) {
        fprintf(f, "# policy %s: t_s waiting kv_device_pct\n", runs[k]->policy_name);
        for (size_t i = 0; i < runs[k]->ts_rows; i++) {
            const double *row = &runs[k]->ts[i * runs[k]->ts_cols];
            fprintf(f, "%.3f %.0f %.3f\n", row[SIM_TS_T_S], row[SIM_TS_WAITING],
                    row[SIM_TS_KV_DEVICE_PCT]);
        }
        if (!runs[k]->ts_rows) fprintf(f, "nan nan nan\n");
        fprintf(f, "\n\n");
    }
    fclose(f);
    snprintf(gp, sizeof gp, "%s/plots-compare.gp", dir);
    if (!(f = fopen(gp, "w"))) return sim_err_setc(-errno, "%s: %s", gp, strerror(errno));
    fprintf(f,
            "# ringlm-sim: %zu policies on one trace; run: gnuplot %s\ncd '%s'\nset grid\nset key "
            "bottom right\n",
            n, gp, dir);
    const char *terms[2][2] = {{"pngcairo size 1000,600 noenhanced", "png"},
                               {"svg size 1000,600 noenhanced", "svg"}};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "set terminal %s\n", terms[k][0]);
        for (int which = 0; which < 2; which++) {
            fprintf(f,
                    "set output 'compare-%s-cdf.%s'\nset title '%s CDF, all requests, per "
                    "policy'\nset xlabel '%s (ms)'\n"
                    "set ylabel 'fraction of requests'\nset logscale x\nset yrange [0:1]\nplot ",
                    which ? "e2e" : "ttft", terms[k][1],
                    which ? "End-to-end latency" : "Time to first token",
                    which ? "end-to-end" : "TTFT");
            for (size_t b = 0; b < n; b++)
                fprintf(f, "%s'compare-%s-cdf.dat' index %zu with lines lw 2 title '%s'",
                        b ? ", " : "", which ? "e2e" : "ttft", b, runs[b]->policy_name);
            fprintf(f, "\nunset logscale x\nset yrange [*:*]\n");
        }
        fprintf(f,
                "set output 'compare-queue.%s'\nset title 'Queue depth per policy'\nset xlabel "
                "'time (s)'\nset ylabel 'waiting requests'\nset key top right\nplot ",
                terms[k][1]);
        for (size_t b = 0; b < n; b++)
            fprintf(f, "%s'compare-queue.dat' index %zu using 1:2 with lines lw 2 title '%s'",
                    b ? ", " : "", b, runs[b]->policy_name);
        fprintf(f, "\nset key bottom right\n");
    }
    fclose(f);
    return run_gnuplot(dir, gp, "compare", note);
}

int sim_report_plot(const char *dir, const char *tag, const sim_run *r, FILE *note)
{
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return sim_err_setc(-errno, "%s: %s", dir, strerror(errno));
    const char *sfx = tag && *tag ? tag : "run";
    char path[1024], gp[1024];
    const char *names_t[SIM_MAX_NAMES], *names_e[SIM_MAX_NAMES];
    unsigned nb_t = 0, nb_e = 0;
    int rc = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/ttft-cdf-%s.dat", dir, sfx);
    if (!(f = fopen(path, "w"))) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    rc = write_cdf(f, r, false, &nb_t, names_t);
    fclose(f);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/e2e-cdf-%s.dat", dir, sfx);
    if (!(f = fopen(path, "w"))) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    rc = write_cdf(f, r, true, &nb_e, names_e);
    fclose(f);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/timeseries-%s.dat", dir, sfx);
    if (!(f = fopen(path, "w"))) return sim_err_setc(-errno, "%s: %s", path, strerror(errno));
    fprintf(f, "# t_s waiting running swapped kv_device_pct kv_host_blocks\n");
    for (size_t i = 0; i < r->ts_rows; i++) {
        const double *row = &r->ts[i * r->ts_cols];
        fprintf(f, "%.3f %.0f %.0f %.0f %.3f %.0f\n", row[SIM_TS_T_S], row[SIM_TS_WAITING],
                row[SIM_TS_RUNNING], row[SIM_TS_SWAPPED], row[SIM_TS_KV_DEVICE_PCT],
                row[SIM_TS_KV_HOST]);
    }
    fclose(f);
    snprintf(gp, sizeof gp, "%s/plots-%s.gp", dir, sfx);
    if (!(f = fopen(gp, "w"))) return sim_err_setc(-errno, "%s: %s", gp, strerror(errno));
    fprintf(f, "# ringlm-sim plots for policy %s (%s); run: gnuplot %s\n", r->policy_name,
            r->policy_hash, gp);
    fprintf(f, "cd '%s'\nset key bottom right\nset grid\n", dir);
    const char *terms[2][2] = {{"pngcairo size 1000,600 noenhanced", "png"},
                               {"svg size 1000,600 noenhanced", "svg"}};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "set terminal %s\n", terms[k][0]);
        for (int which = 0; which < 2; which++) {
            unsigned nb = which ? nb_e : nb_t;
            const char **names = which ? names_e : names_t;
            if (!nb) continue;
            fprintf(f,
                    "set output '%s-cdf-%s.%s'\nset title '%s CDF per tenant — %s'\nset xlabel '%s "
                    "(ms)'\n"
                    "set ylabel 'fraction of requests'\nset logscale x\nset yrange [0:1]\nplot ",
                    which ? "e2e" : "ttft", sfx, terms[k][1],
                    which ? "End-to-end latency" : "Time to first token", r->policy_name,
                    which ? "end-to-end" : "TTFT");
            for (unsigned b = 0; b < nb; b++)
                fprintf(f, "%s'%s-cdf-%s.dat' index %u with lines lw 2 title '%s'", b ? ", " : "",
                        which ? "e2e" : "ttft", sfx, b, names[b]);
            fprintf(f, "\nunset logscale x\nset yrange [*:*]\n");
        }
        fprintf(f,
                "set output 'queue-%s.%s'\nset title 'Queue depth and running sequences — %s'\nset "
                "xlabel 'time (s)'\n"
                "set ylabel 'requests'\nplot 'timeseries-%s.dat' using 1:2 with lines lw 2 title "
                "'waiting', "
                "'' using 1:3 with lines lw 2 title 'running', '' using 1:4 with lines title "
                "'swapped'\n",
                sfx, terms[k][1], r->policy_name, sfx);
        fprintf(f,
                "set output 'kv-%s.%s'\nset title 'KV occupancy — %s'\nset ylabel 'device KV used "
                "(%%)'\n"
                "set y2label 'host KV blocks'\nset y2tics\nset yrange [0:100]\n"
                "plot 'timeseries-%s.dat' using 1:5 with lines lw 2 title 'device %%', '' using "
                "1:6 axes x1y2 with lines title 'host blocks'\n"
                "unset y2tics\nunset y2label\nset yrange [*:*]\n",
                sfx, terms[k][1], r->policy_name, sfx);
    }
    fclose(f);
    return run_gnuplot(dir, gp, sfx, note);
}

static int run_gnuplot(const char *dir, const char *gp, const char *sfx, FILE *note)
{
    char gpbin[1024];
    if (!have_gnuplot(gpbin, sizeof gpbin)) {
        if (note)
            fprintf(note,
                    "note: gnuplot not found; plot data and the script %s are written, no images\n",
                    gp);
        return SIM_PLOT_NO_GNUPLOT;
    }
    pid_t pid = fork();
    if (pid < 0) return sim_err_setc(-errno, "fork: %s", strerror(errno));
    char logp[1100];
    snprintf(logp, sizeof logp, "%s/gnuplot-%s.log", dir, sfx);
    if (pid == 0) {
        /* gnuplot's warnings ("empty y2 range") go to a log, not into the caller's output */
        FILE *lf = fopen(logp, "w");
        if (lf) {
            dup2(fileno(lf), 1);
            dup2(fileno(lf), 2);
        }
        execl(gpbin, "gnuplot", gp, (char *)NULL);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return sim_err_setc(-EIO, "gnuplot %s failed (status %d, see %s)", gp,
                            WIFEXITED(st) ? WEXITSTATUS(st) : -1, logp);
    return 0;
}

int sim_report_gnuplot(const char *dir, const char *gp, const char *tag, FILE *note)
{
    return run_gnuplot(dir, gp, tag, note);
}
