/* SPDX-License-Identifier: MIT */
/*
 * ringlmd end to end, what an operator sees: the /metrics endpoint tracks pools and
 * requests, --check-config and --version name the policy, deadlines end requests with a
 * reason. A real daemon process on a private socket, real client processes (fork +
 * libringlm) (tests/daemon_helpers.h); every test stops every process it starts and checks
 * that every KV block is accounted for.
 *
 * Env: RINGLM_BIN (programs, default build/bin), RINGLM_SHARED (default ../shared).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/stats.h"
#include "shm/ring.h"
#include "shm/wire.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"
#include "tools/prom.h"

TestSuite(daemon_ops, .timeout = 120);

/* ---- metrics ------------------------------------------------------------------------- */

Test(daemon_ops, metrics_endpoint_tracks_pools_and_requests)
{
    char model[512];
    static ref_case cases[12];
    need_stories_refs(model, sizeof model, cases, 12, 4);
    const char *extra[] = {"--metrics", "127.0.0.1:0", "--host-kv-blocks", "32", NULL};
    dmn d;
    dmn_start(&d, model, NULL, extra);
    int port = dmn_metrics_port(&d);
    cr_assert_gt(port, 0, "no 'metrics on port' line in the daemon's stderr");
    gen_job g = {.sock = d.sock, .cases = cases, .n_cases = 4};
    cr_expect_eq(reap(spawn(client_greedy, &g), 60000), 0);
    assert_back_to_baseline(&d, 5000);
    char *body = NULL;
    uint64_t deadline = th_now_ms() + 5000;
    double fin = -1, used = -1, total = -1, freeb = -1, running = -1, usage = -1;
    for (;;) {
        int status = 0;
        free(body);
        body = th_http_get(port, "/metrics", &status, NULL, 0);
        cr_assert(body && status == 200, "GET /metrics failed (status %d)", status);
        /* the built-in policy: this uid's own tenant */
        char fin_key[128];
        snprintf(
            fin_key, sizeof fin_key,
            "ringlm_requests_finished_total{tenant=\"uid%u\",class=\"default\",reason=\"length\"}",
            (unsigned)geteuid());
        fin = prom_value(body, fin_key);
        used = prom_value(body, "ringlm_kv_blocks_used{tier=\"device\"}");
        freeb = prom_value(body, "ringlm_kv_blocks_free{tier=\"device\"}");
        total = prom_value(body, "ringlm_kv_blocks_total{tier=\"device\"}");
        running = prom_value(body, "vllm:num_requests_running");
        usage = prom_value(body, "vllm:kv_cache_usage_perc");
        if (fin >= 3 && used == 0 && running == 0) break;
        if (th_now_ms() > deadline) break;
        th_pause_ms(2);
    }
    cr_log_info("metrics: finished(length) %.0f, device used %.0f free %.0f total %.0f, running "
                "%.0f, usage %.3f",
                fin, used, freeb, total, running, usage);
    cr_expect_geq(fin, 3, "finished requests not counted");
    cr_expect_eq(used, 0);
    cr_expect_eq(used + freeb, total, "device: used + free != total in /metrics");
    cr_expect_eq(total, 1024);
    cr_expect_eq(running, 0);
    cr_expect_eq(usage, 0);
    cr_expect_not_null(strstr(body, "ringlm_info{"), "no info gauge");
    cr_expect_not_null(strstr(body, "ringlm_time_to_first_token_seconds_bucket"),
                       "no TTFT histogram");
    cr_expect_not_null(strstr(body, "ringlm_kv_blocks_total{tier=\"host\"} 32"),
                       "no host tier series");
    free(body);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}

/* --check-config prints the canonical policy and its hash (non-zero exit with the line for a
 * bad one); --version names the model and policy hashes; the running daemon serves that
 * very hash to its clients. */
Test(daemon_ops, check_config_version_and_policy_identity)
{
    need_daemon_binary();
    char dir[] = "/tmp/ringlmd-cc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char good[128], bad[128], cmd[1024], line[512];
    snprintf(good, sizeof good, "%s/good.policy", dir);
    snprintf(bad, sizeof bad, "%s/bad.policy", dir);
    FILE *f = fopen(good, "w");
    fputs("# comment\n[scheduler]\ntoken_budget = 128   # spelt differently below\nprefill_chunk = "
          "64\n",
          f);
    fclose(f);
    f = fopen(bad, "w");
    fputs("[scheduler]\ntoken_budget = 128\nno_such_knob = 1\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --check-config 2>&1",
             th_bin_dir(), good);
    FILE *p = popen(cmd, "r");
    char hash[64] = "";
    while (fgets(line, sizeof line, p)) sscanf(line, "# policy hash %63s", hash);
    cr_expect_eq(pclose(p), 0, "--check-config of a good policy failed");
    cr_assert_eq(strlen(hash), 16, "no '# policy hash' line (got \"%s\")", hash);
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --check-config 2>&1",
             th_bin_dir(), bad);
    p = popen(cmd, "r");
    bool named = false;
    while (fgets(line, sizeof line, p))
        if (strstr(line, "line 3") && strstr(line, "no_such_knob")) named = true;
    cr_expect_neq(pclose(p), 0, "--check-config accepted an unknown key");
    cr_expect(named, "the error does not name line 3 and the key");
    snprintf(cmd, sizeof cmd,
             "%s/ringlmd --model synthetic:stories260K:1 --policy %s --version 2>&1", th_bin_dir(),
             good);
    p = popen(cmd, "r");
    bool has_hash = false, has_model = false;
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "policy") && strstr(line, hash)) has_hash = true;
        if (strstr(line, "model synthetic:stories260K:1 ")) has_model = true;
    }
    cr_expect_eq(pclose(p), 0);
    cr_expect(has_hash && has_model, "--version lacks the model or the policy hash");
    /* The daemon serves the same hash. */
    f = fopen(good, "r");
    char text[512];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    dmn d;
    dmn_start(&d, "synthetic:stories260K:1", text, NULL);
    ringlm_client *c;
    cr_assert_eq(ringlm_connect(d.sock, &c), 0);
    char served[32];
    snprintf(served, sizeof served, "%016llx", (unsigned long long)ringlm_policy_hash(c));
    ringlm_close(c);
    cr_expect_str_eq(served, hash, "session policy hash %s, --check-config said %s", served, hash);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */
    }
}

/* Deadlines: under load, a request whose deadline cannot be met ends with a reason
 * (rejected as infeasible at admission, or timed out) — it never runs on past it. */
Test(daemon_ops, deadlines_end_with_a_reason)
{
    need_daemon_binary();
    char model[512];
    model_or_synthetic(model, sizeof model);
    const char *policy = "[scheduler]\nmode = token_budget\ntoken_budget = 32\nprefill_chunk = 32\n"
                         "max_active_seqs = 4\n";
    dmn d;
    dmn_start(&d, model, policy, NULL);
    char ob[160], od[160];
    snprintf(ob, sizeof ob, "%s/busy.txt", d.dir);
    snprintf(od, sizeof od, "%s/deadline.txt", d.dir);
    /* The deadline requests are sent once the busy ones stream: started at a fixed time
     * instead, a busy client late to start on a loaded machine left them an idle daemon,
     * where all 8 met the 20 ms deadline ("no deadline was enforced", at load 8) */
    int rfd[2];
    cr_assert_eq(pipe(rfd), 0);
    load_job busy = {.sock = d.sock,
                     .n_requests = 24,
                     .concurrency = 24,
                     .prompt_len = 64,
                     .max_new = 200,
                     .token_base = 1,
                     .vocab = 512,
                     .out_path = ob,
                     .ready_fd = rfd[1]};
    pid_t pb = spawn(client_load, &busy);
    close(rfd[1]);
    char b;
    cr_assert_eq(read(rfd[0], &b, 1), 1, "the busy client never got a token");
    close(rfd[0]);
    load_job dl = {.sock = d.sock,
                   .n_requests = 8,
                   .concurrency = 8,
                   .prompt_len = 64,
                   .max_new = 200,
                   .token_base = 2,
                   .vocab = 512,
                   .out_path = od,
                   .ready_fd = -1,
                   .deadline_us = 20000};
    pid_t pd = spawn(client_load, &dl);
    cr_expect_eq(reap(pd, 60000), 0);
    cr_expect_eq(reap(pb, 60000), 0);
    static result_line R[16];
    int n = read_results(od, R, 16);
    cr_assert_eq(n, 8);
    int rejected = 0, timed_out = 0, met = 0;
    for (int i = 0; i < n; i++) {
        if (R[i].reason == RINGLM_FINISH_REJECTED) {
            rejected++;
            cr_expect_eq(R[i].cause, RINGLM_R_DEADLINE_INFEASIBLE, "request %d rejected for %s", i,
                         ringlm_reason_name(R[i].cause));
        } else if (R[i].reason == RINGLM_FINISH_TIMEOUT) {
            timed_out++;
        } else {
            met++;
            cr_expect_leq(R[i].e2e_us, 20000 + 50000,
                          "request %d ran %lld us past a 20 ms deadline "
                          "(%s)",
                          i, R[i].e2e_us, ringlm_reason_name(R[i].reason));
        }
    }
    cr_log_info("deadline 20 ms under load: %d rejected at admission, %d timed out, %d met",
                rejected, timed_out, met);
    cr_expect_gt(rejected + timed_out, 0, "no deadline was enforced");
    assert_back_to_baseline(&d, 5000);
    cr_expect_eq(dmn_stop(&d, SIGTERM, 10000), 0);
    dmn_cleanup(&d);
}
