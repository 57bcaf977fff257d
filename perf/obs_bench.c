/* SPDX-License-Identifier: MIT */
/*
 * perf/obs_bench — what observability costs the loop thread per call (DESIGN.md §9: the
 * decision log and metrics stay off the hot path).
 *
 *   metrics_observe            one histogram observation
 *   metrics_publish (idle)     the per-iteration call between publishes (a clock compare)
 *   metrics_publish (forced)   a real publish with 8 tenants × 3 classes of series
 *   declog enqueue             one decision line into the writer's ring
 *   baseline: write(2)         the same line written synchronously to /dev/null
 *   scrape render              metrics_render of that snapshot (the HTTP thread's cost)
 *
 * Medians of 5 runs; --json prints one object.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/declog.h"
#include "daemon/metrics.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double med5(double *v)
{
    qsort(v, 5, sizeof *v, dcmp);
    return v[2];
}

int main(int argc, char **argv)
{
    int json = argc > 1 && strcmp(argv[1], "--json") == 0;
    metrics *m;
    if (metrics_create(&(metrics_config){.model_name = "bench"}, &m) < 0) {
        fprintf(stderr, "obs_bench: %s\n", metrics_errmsg());
        return 1;
    }
    int series[24];
    const char *tenants[] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"};
    const char *classes[] = {"chat", "batch", "bulk"};
    for (int i = 0; i < 24; i++)
        series[i] = metrics_series(m, metrics_tenant_label(m, tenants[i % 8]),
                                   metrics_class_label(m, classes[i / 8]));
    for (int i = 0; i < 24; i++) {
        metrics_count_reject(m, series[i], SCHED_REJECT_QUEUE_FULL);
        metrics_count_preempt(m, series[i], METRICS_MODE_SWAP, SCHED_DEFER_BLOCKS);
    }
    double obs[5], idle[5], pub[5], enq[5], wr[5], rend[5];
    const int N = 1000000;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ns();
        for (int i = 0; i < N; i++)
            metrics_observe(m, series[i % 24], METRICS_H_TTFT, (uint64_t)(i & 0xffff) * 7);
        obs[r] = (now_ns() - t0) / N;
        t0 = now_ns();
        for (int i = 0; i < N; i++)
            metrics_publish(m, 1000 + (uint64_t)i / 1000, 0); /* within the interval */
        idle[r] = (now_ns() - t0) / N;
        t0 = now_ns();
        for (int i = 0; i < 10000; i++) metrics_publish(m, (uint64_t)i, 1);
        pub[r] = (now_ns() - t0) / 10000;
        t0 = now_ns();
        char *txt;
        size_t len;
        for (int i = 0; i < 20; i++) {
            metrics_render(m, &txt, &len);
            free(txt);
        }
        rend[r] = (now_ns() - t0) / 20;
    }
    declog *d;
    if (declog_create(&(declog_config){.decision_path = "/dev/null"}, &d) < 0) {
        fprintf(stderr, "obs_bench: %s\n", declog_errmsg());
        return 1;
    }
    const char line[] = "{\"t_us\":123456789,\"ev\":\"schedule\",\"req\":4242,\"tenant\":\"alice\","
                        "\"class\":\"chat\","
                        "\"reason\":\"start\",\"blocks\":3,\"wait_us\":1234}";
    int devnull = open("/dev/null", O_WRONLY);
    uint64_t dropped = 0;
    for (int r = 0; r < 5; r++) {
        const int M = 200000;
        double t0 = now_ns();
        for (int i = 0; i < M; i++) declog_decision_line(d, line, sizeof line - 1);
        enq[r] = (now_ns() - t0) / M;
        declog_flush(d, 10000);
        t0 = now_ns();
        for (int i = 0; i < M; i++)
            if (write(devnull, line, sizeof line - 1) < 0) return 1;
        wr[r] = (now_ns() - t0) / M;
    }
    declog_dropped(d, &dropped, NULL);
    declog_destroy(d);
    close(devnull);
    char *txt;
    size_t len;
    metrics_render(m, &txt, &len);
    free(txt);
    double o = med5(obs), id = med5(idle), p = med5(pub), e = med5(enq), w = med5(wr),
           rd = med5(rend);
    if (json) {
        printf("{\"observe_ns\":%.1f,\"publish_idle_ns\":%.1f,\"publish_forced_ns\":%.0f,"
               "\"declog_enqueue_ns\":%.1f,\"write_devnull_ns\":%.1f,\"enqueue_vs_write\":%.3f,"
               "\"render_us\":%.1f,\"exposition_bytes\":%zu,\"decision_lines_dropped\":%llu}\n",
               o, id, p, e, w, e / w, rd / 1e3, len, (unsigned long long)dropped);
    } else {
        printf("metrics_observe            %8.1f ns\n", o);
        printf("metrics_publish (idle)     %8.1f ns   (every iteration)\n", id);
        printf("metrics_publish (forced)   %8.0f ns   (24 series; at most every 100 ms)\n", p);
        printf(
            "declog enqueue             %8.1f ns   (%.2fx of a write(2) to /dev/null: %.1f ns)\n",
            e, e / w, w);
        printf("metrics_render (scrape)    %8.1f us   (%zu bytes; HTTP thread)\n", rd / 1e3, len);
        printf("decision lines dropped     %8llu      (ring full while the writer caught up)\n",
               (unsigned long long)dropped);
    }
    metrics_destroy(m);
    return 0;
}
