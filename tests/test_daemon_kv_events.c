/* SPDX-License-Identifier: MIT */
/*
 * KV-cache events in vLLM's wire format: a real ringlmd with device, host and disk tiers
 * serves a replay that fills, evicts and demotes its prefix cache, and subscribers
 * (tests/kv_subscriber.py, run by Debian's python3 with python3-zmq and python3-msgpack,
 * decoding every batch with vLLM's schema) must end up believing each tier holds exactly
 * what the daemon's index holds — a subscriber there from the start, one that joins late
 * through the replay socket, and one whose events overflowed the loop's queue and were
 * resynchronised with AllBlocksCleared. The daemon's index is read from the file ringlmd
 * --check-invariants writes beside its stats file: block for block, not only its size.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers.h"

TestSuite(daemon_kv_events, .timeout = 240);

#define PYTHON "/usr/bin/python3" /* Debian's, where python3-zmq and python3-msgpack live */

static th_daemon g_d;
static th_proc g_sub[2];
static void stop_all(void)
{
    for (int i = 0; i < 2; i++) th_proc_stop(&g_sub[i], SIGTERM, 5000);
    th_daemon_stop(&g_d, SIGTERM, 15000);
    th_daemon_cleanup(&g_d);
}

static void need_python(void)
{
    char *argv[] = {PYTHON, "-c", "import zmq, msgpack", NULL};
    char *out = NULL, *err = NULL;
    if (access(PYTHON, X_OK) || th_run(argv, &out, &err, 30) != 0)
        cr_skip_test("%s with zmq and msgpack (python3-zmq, python3-msgpack) is needed", PYTHON);
    free(out);
    free(err);
}

/* The endpoints the daemon logged: "kv events on PUB, replay on REPLAY". */
static void endpoints(char *pub, char *replay, size_t cap)
{
    for (uint64_t dl = th_now_ms() + 5000;; th_pause_ms(5)) {
        const char *out = th_daemon_output(&g_d), *at = strstr(out, "kv events on ");
        const char *nl = at ? strchr(at, '\n') : NULL;
        if (nl) {
            char line[600];
            snprintf(line, sizeof line, "%.*s", (int)(nl - at), at);
            char *r = strstr(line, ", replay on ");
            if (r) {
                snprintf(replay, cap, "%s", r + strlen(", replay on "));
                *r = 0;
            }
            snprintf(pub, cap, "%s", line + strlen("kv events on "));
            return;
        }
        cr_assert(th_now_ms() < dl, "ringlmd named no kv events endpoint:\n%s", out);
    }
}

static int metrics_port(void)
{
    int port = 0;
    for (uint64_t dl = th_now_ms() + 5000; !port; th_pause_ms(5)) {
        const char *out = th_daemon_output(&g_d), *at = strstr(out, "metrics on port ");
        if (at) port = atoi(at + strlen("metrics on port "));
        cr_assert(port > 0 || th_now_ms() < dl, "ringlmd named no metrics port:\n%s", out);
    }
    return port;
}

/* A sample's value from /metrics (-1 when absent). */
static double metric(int port, const char *series)
{
    int status = 0;
    char *body = th_http_get(port, "/metrics", &status, NULL, 0);
    cr_assert(body && status == 200, "GET /metrics: %d", status);
    double v = -1;
    size_t n = strlen(series);
    for (const char *p = strstr(body, series); p; p = strstr(p + 1, series))
        if ((p == body || p[-1] == '\n') && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
    free(body);
    return v;
}

/* The daemon's index, per tier: at rest every cached block is held by no sequence, so the
 * cached blocks no sequence holds are all of them. */
static const char *const tier_of_medium[3][2] = {
    {"GPU", "ringlm_prefix_cache_blocks{tier=\"device\"}"},
    {"CPU", "ringlm_prefix_cache_blocks{tier=\"host\"}"},
    {"DISK", "ringlm_prefix_cache_blocks{tier=\"disk\"}"}};

static void start_subscriber(int i, const char *pub, const char *replay, char *state, size_t cap)
{
    snprintf(state, cap, "%s/sub%d.json", g_d.dir, i);
    char log[160];
    snprintf(log, sizeof log, "%s/sub%d.log", g_d.dir, i);
    const char *argv[] = {PYTHON, "tests/kv_subscriber.py", pub, replay ? replay : "-", state,
                          NULL};
    th_proc_start(&g_sub[i], argv, log);
    /* it writes its state once subscribed (and, joining late, replayed) */
    for (uint64_t dl = th_now_ms() + 15000; !th_exists(state); th_pause_ms(10))
        cr_assert(th_now_ms() < dl, "the subscriber never started: %s", th_read_file(log));
}

static json_t *read_state(const char *state)
{
    char *text = th_read_file(state);
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    cr_assert(j, "subscriber state is not JSON: %s", text);
    free(text);
    json_t *bad = json_object_get(j, "bad");
    cr_assert(json_array_size(bad) == 0, "an event did not decode with vLLM's schema: %s",
              json_dumps(bad, 0));
    return j;
}

static char g_stats[160]; /* --stats-file; with --check-invariants the index is beside it */

/* The daemon's own index (STATS.prefix-index.json, written by ringlmd --check-invariants):
 * per medium, an object whose keys are the hashes of the blocks that tier holds. */
static json_t *daemon_index(void)
{
    char path[200];
    snprintf(path, sizeof path, "%s.prefix-index.json", g_stats);
    json_t *j = NULL;
    for (uint64_t dl = th_now_ms() + 5000; !j; th_pause_ms(20)) {
        char *text = th_exists(path) ? th_read_file(path) : NULL;
        j = text ? json_loads(text, 0, NULL) : NULL;
        free(text);
        cr_assert(j || th_now_ms() < dl, "ringlmd wrote no prefix index at %s", path);
    }
    json_t *sets = json_object();
    for (int t = 0; t < 3; t++) {
        json_t *a = json_object_get(j, tier_of_medium[t][0]), *set = json_object();
        cr_assert(json_is_array(a), "no %s in the index", tier_of_medium[t][0]);
        for (size_t i = 0; i < json_array_size(a); i++)
            json_object_set_new(set, json_string_value(json_array_get(a, i)), json_true());
        json_object_set_new(sets, tier_of_medium[t][0], set);
    }
    json_decref(j);
    return sets;
}

/* Whether the subscriber's sets are the index's, tier by tier, block by block; why not. */
static bool same_as_index(json_t *st, json_t *index, int port, char *why, size_t cap)
{
    why[0] = 0;
    for (int t = 0; t < 3; t++) {
        const char *m = tier_of_medium[t][0];
        json_t *told = json_object_get(st, m), *held = json_object_get(index, m);
        size_t n_told = json_array_size(told), n_held = json_object_size(held), missing = 0;
        for (size_t i = 0; i < n_told; i++)
            missing += !json_object_get(held, json_string_value(json_array_get(told, i)));
        /* the index's size is also what /metrics says the tier caches */
        double want = metric(port, tier_of_medium[t][1]);
        if (want < 0) want = 0; /* a tier not configured */
        if (n_told != n_held || missing || (double)n_held != want) {
            snprintf(why + strlen(why), cap - strlen(why),
                     " %s: told %zu blocks (%zu not in the index), index %zu, metrics %g;", m,
                     n_told, missing, n_held, want);
        }
    }
    return !why[0];
}

/* Waits until the subscriber believes each tier holds exactly the blocks the daemon's index
 * holds (events arrive within milliseconds of the change); fails quoting both. Returns its
 * last state. */
static json_t *converge(int port, const char *state)
{
    char why[1024];
    for (uint64_t dl = th_now_ms() + 10000;; th_pause_ms(50)) {
        json_t *j = read_state(state), *index = daemon_index();
        bool same = same_as_index(j, index, port, why, sizeof why);
        json_decref(index);
        if (same) return j;
        cr_assert(th_now_ms() < dl, "the subscriber's view never matched the index:%s", why);
        json_decref(j);
    }
}

static void run_replay(const char *trace, int n_req)
{
    FILE *f = fopen(trace, "w");
    cr_assert(f);
    fprintf(f, "TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for (int i = 0; i < n_req; i++)
        fprintf(f, "2023-11-16 18:17:%02d.%03d0000,%d,%d\n", 3 + i * 40 / 1000, (i * 40) % 1000,
                40 + (i * 53) % 90, 8 + (i * 7) % 24);
    fclose(f);
    char *ringlm = th_path(th_bin_dir(), "ringlm");
    char *argv[] = {ringlm, "--socket", g_d.sock,  "replay", (char *)trace, "--clients",
                    "2",    "--json",   "--vocab", "500",    NULL};
    char *out, *err;
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "replay exit %d: %s\n%s", rc, err, out);
    free(out);
    free(err);
    free(ringlm);
}

/* The daemon's running-requests gauge, labelled with the model it serves. */
static char g_running[160] = "vllm:num_requests_running{model_name=\"stories260K\",engine=\"0\"}";

/* Idle: nothing waiting or running, so every cached block is unheld. */
static void wait_idle(int port)
{
    for (uint64_t dl = th_now_ms() + 10000;; th_pause_ms(20)) {
        if (metric(port, "ringlm_queue_depth") == 0 && metric(port, g_running) == 0) return;
        cr_assert(th_now_ms() < dl, "the daemon never went idle");
    }
}

static char g_reqlog[160];

/* Every block a subscriber was told of is a block of some request: its hash, to the 53 bits
 * the request log keeps, is among the log's block keys of the prompts and answers. */
static void told_blocks_are_requests_blocks(json_t *st, int n_req)
{
    json_t *known = json_object();
    /* the log's writer thread writes a request's line after it ended: wait for all */
    char *log = NULL, *save = NULL;
    for (uint64_t dl = th_now_ms() + 10000;; th_pause_ms(20)) {
        log = th_read_file(g_reqlog);
        int lines = 0;
        for (const char *p = log; *p; p++) lines += *p == '\n';
        if (lines >= n_req) break;
        cr_assert(th_now_ms() < dl, "the request log has %d lines of %d", lines, n_req);
        free(log);
    }
    for (char *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(l, 0, NULL);
        cr_assert(j, "request log line: %s", l);
        const char *keys[] = {"hash_ids", "answer_hash_ids"};
        for (int k = 0; k < 2; k++) {
            json_t *a = json_object_get(j, keys[k]);
            for (size_t i = 0; i < json_array_size(a); i++) {
                char h[32];
                snprintf(h, sizeof h, "%lld", (long long)json_integer_value(json_array_get(a, i)));
                json_object_set_new(known, h, json_true());
            }
        }
        json_decref(j);
    }
    free(log);
    for (int t = 0; t < 3; t++) {
        json_t *a = json_object_get(st, tier_of_medium[t][0]);
        for (size_t i = 0; i < json_array_size(a); i++) {
            uint64_t h = strtoull(json_string_value(json_array_get(a, i)), NULL, 10);
            char hs[32];
            snprintf(hs, sizeof hs, "%lld", (long long)(h & ((1ull << 53) - 1)));
            cr_assert(json_object_get(known, hs), "%s holds block %s that no request had",
                      tier_of_medium[t][0], hs);
        }
    }
    json_decref(known);
}

/* ringlmd with the host and disk tiers and the KV event publisher; `spec` the model (NULL:
 * stories260K), served under `name`. */
static void start_daemon_model(const char *queue, const char *encoding, const char *spec,
                               const char *name)
{
    char model[512], disk[160];
    if (spec) {
        snprintf(model, sizeof model, "%s", spec);
    } else {
        snprintf(model, sizeof model, "%s/models/stories260K.bin", th_shared_dir());
        if (access(model, R_OK)) cr_skip_test("stories260K not under %s", th_shared_dir());
        name = "stories260K";
    }
    snprintf(g_running, sizeof g_running,
             "vllm:num_requests_running{model_name=\"%s\",engine=\"0\"}", name);
    th_daemon_init(&g_d);
    snprintf(disk, sizeof disk, "%s/kv.disk", g_d.dir);
    snprintf(g_reqlog, sizeof g_reqlog, "%s/req.jsonl", g_d.dir);
    snprintf(g_stats, sizeof g_stats, "%s/stats.json", g_d.dir);
    const char *args[] = {"--request-log",
                          g_reqlog,
                          "--stats-file",
                          g_stats,
                          "--check-invariants",
                          "--model",
                          model,
                          "--metrics",
                          "127.0.0.1:0",
                          "--kv-blocks",
                          "40",
                          "--host-kv-blocks",
                          "12",
                          "--disk-kv",
                          disk,
                          "--disk-kv-blocks",
                          "12",

                          "--kv-events",
                          "tcp://127.0.0.1:*",
                          "--kv-events-replay",
                          "tcp://127.0.0.1:*",
                          "--kv-events-encoding",
                          encoding,
                          "--served-model-name",
                          name,
                          queue ? "--kv-events-queue" : NULL,
                          queue,
                          NULL};
    th_daemon_start(&g_d, args, 20000);
}

static void start_daemon_enc(const char *queue, const char *encoding)
{
    start_daemon_model(queue, encoding, NULL, NULL);
}

static void start_daemon(const char *queue)
{
    start_daemon_enc(queue, "array");
}

static bool same_sets(json_t *a, json_t *b)
{
    for (int t = 0; t < 3; t++)
        if (!json_equal(json_object_get(a, tier_of_medium[t][0]),
                        json_object_get(b, tier_of_medium[t][0])))
            return false;
    return true;
}

Test(daemon_kv_events, subscribers_hold_the_index_through_evictions_demotions_and_a_late_join,
     .fini = stop_all)
{
    need_python();
    /* stories15M's prefill of a block costs milliseconds against microseconds to reload it
     * from the host tier, so the cost model demotes whatever the machine's load; with
     * stories260K both were microseconds and demote-or-drop turned on the load */
    start_daemon_model(NULL, "array", "synthetic:stories15M:7", "stories15M");
    int port = metrics_port();
    char pub[600], replay[600] = "", st0[200], st1[200];
    endpoints(pub, replay, sizeof pub);
    cr_assert(replay[0], "no replay endpoint in: %s", th_daemon_output(&g_d));
    start_subscriber(0, pub, NULL, st0, sizeof st0);
    char trace[200];
    snprintf(trace, sizeof trace, "%s/trace.csv", g_d.dir);
    run_replay(trace, 24);
    wait_idle(port);
    /* the workload filled the device and demoted blocks to the host tier, and dropped some */
    cr_assert_gt(metric(port, "ringlm_prefix_cache_demoted_blocks_total{tier=\"host\"}"), 0);
    json_t *live = converge(port, st0);
    cr_assert_gt(json_integer_value(json_object_get(live, "removed")), 0, "no block was removed");
    cr_assert_eq(json_integer_value(json_object_get(live, "gaps")), 0, "sequence numbers skipped");
    cr_assert_eq(json_integer_value(json_object_get(live, "cleared")), 0);
    json_t *forms = json_object_get(live, "forms");
    cr_assert(json_array_size(forms) == 1 &&
                  !strcmp(json_string_value(json_array_get(forms, 0)), "array"),
              "vLLM 0.11's events are arrays: %s", json_dumps(forms, 0));
    /* a prompt's blocks computed in one step come as one BlockStored, as vLLM sends them */
    cr_assert_lt(json_integer_value(json_object_get(live, "stored_events")),
                 json_integer_value(json_object_get(live, "stored")),
                 "one BlockStored per block: vLLM batches a step's blocks of a request");
    told_blocks_are_requests_blocks(live, 24);

    /* a subscriber joining now learns the same from the replay socket */
    start_subscriber(1, pub, replay, st1, sizeof st1);
    json_t *late = converge(port, st1);
    cr_assert_gt(json_integer_value(json_object_get(late, "replayed")), 0);
    /* both views of the index now (it may still have moved since the live one was read) */
    for (uint64_t dl = th_now_ms() + 10000; !same_sets(live, late); th_pause_ms(50)) {
        cr_assert(th_now_ms() < dl, "the late joiner's view differs from the live one");
        json_decref(live);
        json_decref(late);
        live = converge(port, st0);
        late = converge(port, st1);
    }
    cr_assert_eq(metric(port, "ringlm_kv_events_dropped_total"), 0);
    json_decref(live);
    json_decref(late);
}

Test(daemon_kv_events, an_overflowed_queue_drops_and_resynchronises_subscribers, .fini = stop_all)
{
    need_python();
    start_daemon("2"); /* room for two events: the workload overflows it at once */
    int port = metrics_port();
    char pub[600], replay[600] = "", st0[200];
    endpoints(pub, replay, sizeof pub);
    start_subscriber(0, pub, NULL, st0, sizeof st0);
    char trace[200];
    snprintf(trace, sizeof trace, "%s/trace.csv", g_d.dir);
    run_replay(trace, 16);
    wait_idle(port);
    json_t *j = converge(port, st0);
    cr_assert_gt(metric(port, "ringlm_kv_events_dropped_total"), 0, "nothing overflowed");
    cr_assert_gt(metric(port, "ringlm_kv_events_resyncs_total"), 0);
    cr_assert_gt(json_integer_value(json_object_get(j, "cleared")), 0,
                 "the subscriber was never told AllBlocksCleared");
    cr_assert_gt(json_array_size(json_object_get(j, "GPU")) +
                     json_array_size(json_object_get(j, "CPU")) +
                     json_array_size(json_object_get(j, "DISK")),
                 0);
    json_decref(j);
}

/* Current vLLM sends each event as a map of named fields ({"type": "BlockStored",
 * "block_hashes": …}); with --kv-events-encoding map a subscriber that decodes that form holds
 * the index as well. */
Test(daemon_kv_events, map_encoded_events_as_current_vllm_sends_them, .fini = stop_all)
{
    need_python();
    start_daemon_enc(NULL, "map");
    int port = metrics_port();
    char pub[600], replay[600] = "", st0[200];
    endpoints(pub, replay, sizeof pub);
    start_subscriber(0, pub, NULL, st0, sizeof st0);
    char trace[200];
    snprintf(trace, sizeof trace, "%s/trace.csv", g_d.dir);
    run_replay(trace, 16);
    wait_idle(port);
    json_t *j = converge(port, st0);
    json_t *forms = json_object_get(j, "forms");
    cr_assert(json_array_size(forms) == 1 &&
                  !strcmp(json_string_value(json_array_get(forms, 0)), "map"),
              "the events were not all maps: %s", json_dumps(forms, 0));
    cr_assert_gt(json_integer_value(json_object_get(j, "removed")), 0);
    json_decref(j);
}
