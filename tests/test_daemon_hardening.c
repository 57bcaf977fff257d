/* SPDX-License-Identifier: MIT */
/*
 * ringlmd in the hands of a careless operator or a hostile local user: files it must never
 * delete or overwrite, logs torn by a crash, descriptor limits, doorbell floods, the order
 * of its start-up checks, and the messages of the programs around it. Each test starts
 * real processes (ringlmd, clients; an unprivileged uid, 65534, where the point is what a
 * user other than root can do) and stops every one it starts.
 *
 * Env: RINGLM_BIN (programs, default build/bin).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ringlm.h"
#include "formats/logfile.h"
#include "shm/wire.h"
#include "tests/helpers.h"

#define NOBODY_UID 65534u
#define MODEL      "synthetic:stories260K:7"

/* ---- harness ------------------------------------------------------------------------- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* Runs argv (argv[0] a path) as uid (0: as this process), its output to log, and waits up
 * to timeout_ms for it to exit. Its exit status, or -1 when it was still running (it is
 * killed then: a daemon that should have refused to start started). */
static int run_as(unsigned uid, const char *const *argv, const char *log, int timeout_ms)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        close_range(3, ~0u, 0);
        if (uid && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    th_proc p = {.pid = pid};
    int rc = th_proc_wait(&p, timeout_ms);
    if (rc < 0) th_proc_stop(&p, SIGKILL, 5000);
    return rc;
}

static void need_root(void)
{
    if (geteuid() != 0) cr_skip_test("needs root (to run a process under another uid)");
}

/* ---- files ringlmd does not own ------------------------------------------------------ */

Test(files, socket_path_on_a_regular_file_is_left_as_it_is)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *prog = th_program("ringlmd");
    char *path = th_path(d.dir, "precious.txt"), *log = th_path(d.dir, "second.log");
    write_file(path, "the operator's notes\n");
    const char *argv[] = {prog, "--echo", "--numa-node", "off", "--socket", path, NULL};
    int rc = run_as(0, argv, log, 10000);
    char *out = th_read_file(log);
    cr_expect_eq(rc, 1, "ringlmd on a regular file: exit %d (%s)", rc, out);
    cr_expect(strstr(out, "is not a socket"), "no reason given: %s", out);
    char *left = th_read_file(path);
    cr_expect_str_eq(left, "the operator's notes\n", "the file at --socket was changed or removed");
    free(left);
    free(out);
    free(path);
    free(log);
    free(prog);
    th_daemon_cleanup(&d);
}

Test(files, second_daemon_leaves_the_live_socket_alone)
{
    th_daemon d = {0};
    const char *args[] = {"--echo", NULL};
    th_daemon_start(&d, args, 10000);
    char *prog = th_program("ringlmd");
    char *log = th_path(d.dir, "second.log");
    const char *argv[] = {prog, "--echo", "--numa-node", "off", "--socket", d.sock, NULL};
    int rc = run_as(0, argv, log, 10000);
    char *out = th_read_file(log);
    cr_expect_eq(rc, 1, "a second ringlmd on a live socket: exit %d (%s)", rc, out);
    cr_expect(strstr(out, "another daemon listens"), "no reason given: %s", out);
    struct stat st;
    cr_expect(lstat(d.sock, &st) == 0 && S_ISSOCK(st.st_mode),
              "the live daemon's socket file is gone");
    int fd = th_unix_connect(d.sock, false);
    cr_expect_geq(fd, 0, "the first daemon is unreachable: %s", strerror(-fd));
    if (fd >= 0) close(fd);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    free(out);
    free(log);
    free(prog);
    th_daemon_cleanup(&d);
}

/* A user who may not connect to root's socket (mode 0600) must not be able to take its
 * place either, even where the directory lets them remove files: a socket that cannot be
 * probed is not stale. */
Test(files, unprivileged_daemon_never_replaces_a_socket_it_cannot_probe)
{
    need_root();
    th_daemon d = {0};
    th_daemon_init(&d);
    chmod(d.dir, 0777);
    const char *args[] = {"--echo", "--socket-mode", "0600", NULL};
    th_daemon_start(&d, args, 10000);
    char *prog = th_program("ringlmd");
    char *log = th_path(d.dir, "nobody.log");
    const char *argv[] = {prog, "--echo", "--numa-node", "off", "--socket", d.sock, NULL};
    int rc = run_as(NOBODY_UID, argv, log, 10000);
    char *out = th_read_file(log);
    cr_expect_eq(rc, 1, "ringlmd as uid %u on root's socket: exit %d (%s)", NOBODY_UID, rc, out);
    struct stat st;
    cr_expect(lstat(d.sock, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == 0,
              "root's socket was removed or replaced by uid %u", NOBODY_UID);
    int fd = th_unix_connect(d.sock, false);
    cr_expect_geq(fd, 0, "the first daemon is unreachable: %s", strerror(-fd));
    if (fd >= 0) close(fd);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    free(out);
    free(log);
    free(prog);
    th_daemon_cleanup(&d);
}

Test(files, disk_tier_on_someone_elses_file_is_refused)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *prog = th_program("ringlmd");
    char *path = th_path(d.dir, "precious.db"), *log = th_path(d.dir, "tier.log");
    write_file(path, "rows the operator keeps\n");
    const char *argv[] = {prog,       "--model", MODEL,       "--numa-node", "off",
                          "--socket", d.sock,    "--disk-kv", path,          "--disk-kv-blocks",
                          "8",        "--quiet", NULL};
    int rc = run_as(0, argv, log, 30000);
    char *out = th_read_file(log);
    cr_expect(rc > 0, "ringlmd with --disk-kv on someone's file: exit %d (%s)", rc, out);
    cr_expect(strstr(out, "not a ringlmd disk tier file"), "no reason given: %s", out);
    char *left = th_read_file(path);
    cr_expect_str_eq(left, "rows the operator keeps\n", "the file at --disk-kv was overwritten");
    free(left);
    free(out);

    /* Its own tier file, left by an earlier run, it takes back. */
    char *tier = th_path(d.dir, "tier.kv");
    for (int run = 0; run < 2; run++) {
        th_daemon r = {0};
        th_daemon_init(&r);
        const char *args[] = {"--model",          MODEL, "--disk-kv", tier,
                              "--disk-kv-blocks", "8",   "--quiet",   NULL};
        th_daemon_start(&r, args, 30000);
        cr_expect_eq(th_daemon_stop(&r, SIGTERM, 10000), 0, "run %d: %s", run,
                     th_daemon_output(&r));
        th_daemon_cleanup(&r);
    }
    free(tier);
    free(path);
    free(log);
    free(prog);
    th_daemon_cleanup(&d);
}

Test(files, stats_file_never_truncates_a_neighbour)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *stats = th_path(d.dir, "stats.json"), *tmp = th_path(d.dir, "stats.json.tmp");
    write_file(tmp, "a file that happens to be named so\n");
    const char *args[] = {"--model", MODEL, "--stats-file", stats, "--quiet", NULL};
    th_daemon_start(&d, args, 30000);
    uint64_t deadline = th_now_ms() + 10000;
    while (!th_exists(stats) && th_now_ms() < deadline) th_pause_ms(10);
    cr_expect(th_exists(stats), "no stats file within 10 s: %s", th_daemon_output(&d));
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    char *left = th_read_file(tmp);
    cr_expect_str_eq(left, "a file that happens to be named so\n",
                     "the stats writer emptied or replaced %s", tmp);
    free(left);
    free(stats);
    free(tmp);
    th_daemon_cleanup(&d);
}

/* ---- start-up: every path, port and permission before the model ---------------------- */

/* ringlmd with a model that does not exist: whatever it reports is what it checked before
 * it tried to load the model (which, for a real one, takes seconds to minutes). */
static char *start_with_missing_model(th_daemon *d, const char *const *extra, int *rc)
{
    char *prog = th_program("ringlmd");
    char *model = th_path(d->dir, "no-such-model.bin"), *log = th_path(d->dir, "start.log");
    const char *argv[32] = {prog, "--model", model, "--numa-node", "off"};
    int n = 5;
    for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    *rc = run_as(0, argv, log, 30000);
    char *out = th_read_file(log);
    free(prog);
    free(model);
    free(log);
    return out;
}

Test(startup, a_socket_in_use_is_reported_before_the_model_loads)
{
    th_daemon d = {0};
    const char *args[] = {"--echo", NULL};
    th_daemon_start(&d, args, 10000);
    const char *extra[] = {"--socket", d.sock, NULL};
    int rc;
    char *out = start_with_missing_model(&d, extra, &rc);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "another daemon listens"), "not reported first: %s", out);
    cr_expect(!strstr(out, "no-such-model"), "the model was tried first: %s", out);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    free(out);
    th_daemon_cleanup(&d);
}

Test(startup, a_bad_socket_directory_is_reported_before_the_model_loads)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *sock = th_path(d.dir, "missing/s.sock");
    const char *extra[] = {"--socket", sock, NULL};
    int rc;
    char *out = start_with_missing_model(&d, extra, &rc);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "socket directory") && strstr(out, "missing"), "not reported first: %s",
              out);
    cr_expect(!strstr(out, "no-such-model"), "the model was tried first: %s", out);
    free(out);
    free(sock);
    th_daemon_cleanup(&d);
}

Test(startup, a_metrics_port_in_use_is_reported_before_the_model_loads)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    /* A port someone else listens on. */
    int busy = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(bind(busy, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(busy, 1) == 0);
    socklen_t sl = sizeof sa;
    getsockname(busy, (struct sockaddr *)&sa, &sl);
    char spec[64];
    snprintf(spec, sizeof spec, "127.0.0.1:%d", ntohs(sa.sin_port));
    const char *extra[] = {"--socket", d.sock, "--metrics", spec, NULL};
    int rc;
    char *out = start_with_missing_model(&d, extra, &rc);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--metrics") && strstr(out, "in use"), "not reported first: %s", out);
    cr_expect(!strstr(out, "no-such-model"), "the model was tried first: %s", out);
    cr_expect(!th_exists(d.sock), "a socket was left behind");
    close(busy);
    free(out);
    th_daemon_cleanup(&d);
}

Test(startup, an_unwritable_log_is_reported_before_the_model_loads)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *declog = th_path(d.dir, "missing/decisions.jsonl");
    const char *extra[] = {"--socket", d.sock, "--decision-log", declog, NULL};
    int rc;
    char *out = start_with_missing_model(&d, extra, &rc);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--decision-log") && strstr(out, "missing/decisions.jsonl"),
              "not reported first: %s", out);
    cr_expect(!strstr(out, "no-such-model"), "the model was tried first: %s", out);
    free(out);
    free(declog);
    th_daemon_cleanup(&d);
}

Test(startup, loading_and_warming_up_are_announced_before_listening)
{
    th_daemon d = {0};
    const char *args[] = {"--model", MODEL, NULL};
    th_daemon_start(&d, args, 30000);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    const char *out = th_daemon_output(&d);
    const char *load = strstr(out, "loading model"), *warm = strstr(out, "warming up");
    const char *listen = strstr(out, "listening on");
    cr_expect(load && warm && listen && load < warm && warm < listen,
              "no progress before listening: %s", out);
    th_daemon_cleanup(&d);
}

/* ---- --check-config of a policy alone, and who may name tenants ---------------------- */

static int check_config(th_daemon *d, const char *policy, const char *gateway_user, char **out,
                        char **err)
{
    char *prog = th_program("ringlmd");
    char *path = th_path(d->dir, "p.policy");
    write_file(path, policy);
    char *argv[] = {prog, "--check-config", "--policy", path, NULL, NULL, NULL};
    if (gateway_user) {
        argv[4] = "--gateway-user";
        argv[5] = (char *)gateway_user;
    }
    int rc = th_run(argv, out, err, 30);
    free(path);
    free(prog);
    return rc;
}

Test(check_config, works_without_a_model_and_reports_an_empty_trust_list)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *out, *err;
    int rc = check_config(&d, "[tenant a]\nuids = 1000\n", NULL, &out, &err);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, err);
    cr_expect(strstr(out, "# policy hash "), "no policy printed: %s", out);
    cr_expect(strstr(err, "[trust] lists no uid"), "an empty [trust] not reported: %s", err);
    free(out);
    free(err);
    th_daemon_cleanup(&d);
}

Test(check_config, fails_when_the_gateway_user_is_not_trusted)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *out, *err;
    int rc = check_config(&d, "[trust]\nuids = 998\n", "65534", &out, &err);
    cr_expect_eq(rc, 1, "an untrusted gateway user: exit %d: %s", rc, err);
    cr_expect(strstr(err, "65534") && strstr(err, "not in [trust]"), "not reported: %s", err);
    free(out);
    free(err);
    rc = check_config(&d, "[trust]\nuids = 998 65534\n", "65534", &out, &err);
    cr_expect_eq(rc, 0, "a trusted gateway user: exit %d: %s", rc, err);
    free(out);
    free(err);
    th_daemon_cleanup(&d);
}

/* ---- the programs' messages and flags ------------------------------------------------- */

Test(programs, ringlmd_takes_h_for_help)
{
    char *prog = th_program("ringlmd");
    char *argv[] = {prog, "-h", NULL}, *out, *err;
    int rc = th_run(argv, &out, &err, 30);
    cr_expect_eq(rc, 0, "ringlmd -h: exit %d: %s", rc, err);
    cr_expect(strstr(out, "usage: ringlmd"), "no usage on stdout: %s", out);
    free(out);
    free(err);
    free(prog);
}

/* --packed-weights takes auto, on or off; anything else is refused before a model is read,
 * naming the option and the word it got. */
Test(programs, ringlmd_refuses_an_unknown_packed_weights_mode)
{
    char *prog = th_program("ringlmd");
    char *argv[] = {prog, "--packed-weights", "maybe", "--model", "no-such-model.gguf", NULL};
    char *out, *err;
    int rc = th_run(argv, &out, &err, 30);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
    cr_expect(strstr(err, "--packed-weights 'maybe'") && strstr(err, "auto, on or off"),
              "not named: %s", err);
    cr_expect(!strstr(err, "no-such-model"), "the model was tried: %s", err);
    free(out);
    free(err);
    free(prog);
}

Test(programs, every_program_prints_its_version)
{
    const char *names[] = {"ringlm-run", "ringlm-mkmodel", "ringlm-sim", "ringlmd"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *prog = th_program(names[i]);
        char *argv[] = {prog, "--version", NULL}, *out, *err;
        int rc = th_run(argv, &out, &err, 30);
        char want[64];
        snprintf(want, sizeof want, "%s %s", names[i], ringlm_version(NULL));
        cr_expect_eq(rc, 0, "%s --version: exit %d: %s", names[i], rc, err);
        cr_expect(!strncmp(out, want, strlen(want)), "%s --version said \"%s\", want \"%s\"",
                  names[i], out, want);
        free(out);
        free(err);
        free(prog);
    }
}

Test(programs, sim_plot_into_a_missing_directory_fails_naming_it)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *prog = th_program("ringlm-sim");
    char *dir = th_path(d.dir, "missing/plots");
    char *argv[] = {prog, "--workload", "poisson", "--plot", dir, NULL}, *out, *err;
    int rc = th_run(argv, &out, &err, 120);
    cr_expect_neq(rc, 0, "ringlm-sim --plot into a missing directory: exit 0 (%s)", err);
    cr_expect(strstr(err, dir), "the path is not named: %s", err);
    free(out);
    free(err);
    free(dir);
    free(prog);
    th_daemon_cleanup(&d);
}

/* A user the socket's mode keeps out is told so, not sent looking for a daemon that runs. */
Test(programs, a_refused_connect_says_permission_denied)
{
    need_root();
    th_daemon d = {0};
    th_daemon_init(&d);
    chmod(d.dir, 0755);
    const char *args[] = {"--echo", "--socket-mode", "0600", NULL};
    th_daemon_start(&d, args, 10000);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        if (setgid(NOBODY_UID) != 0 || setuid(NOBODY_UID) != 0) _exit(126);
        ringlm_client *c = NULL;
        int r = ringlm_connect(d.sock, &c);
        const char *msg = r == 0 ? "connected" : ringlm_errdetail();
        if (write(p[1], msg, strlen(msg)) < 0) _exit(3);
        _exit(r == 0 ? 1 : 0);
    }
    close(p[1]);
    char msg[512] = "";
    th_readable(p[0], 10000);
    ssize_t n = read(p[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(p[0]);
    th_reap(pid, 5000);
    cr_expect(strstr(msg, "permission denied") && strstr(msg, d.sock),
              "uid %u refused by the socket's mode was told: %s", NOBODY_UID, msg);
    cr_expect(!strstr(msg, "is ringlmd running"), "sent looking for the daemon: %s", msg);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    th_daemon_cleanup(&d);
}

/* ---- logs torn by a crash ------------------------------------------------------------- */

/* One request through the daemon at sock, to its FINISH. */
static void one_request(const char *sock)
{
    ringlm_client *c = NULL;
    int r = ringlm_connect(sock, &c);
    cr_assert_eq(r, 0, "connect: %s", ringlm_errdetail());
    int32_t prompt[] = {1, 2, 3, 4};
    ringlm_request rq;
    ringlm_request_init(&rq);
    rq.prompt = prompt;
    rq.n_prompt = 4;
    rq.max_new_tokens = 4;
    uint64_t id = 0;
    cr_assert_eq(ringlm_submit(c, &rq, &id), 0, "submit: %s", ringlm_errdetail());
    ringlm_event ev;
    uint64_t deadline = th_now_ms() + 20000;
    for (;;) {
        r = ringlm_next_event(c, &ev, 1000);
        cr_assert_geq(r, 0, "next_event: %s", ringlm_errdetail());
        if (r == 1 && ev.kind == RINGLM_EV_FINISH && ev.req_id == id) break;
        cr_assert_lt(th_now_ms(), deadline, "no FINISH within 20 s");
    }
    ringlm_close(c);
}

/* A daemon run that serves one request with its request log at path. */
static void run_logging_daemon(const char *path)
{
    th_daemon d = {0};
    const char *args[] = {"--model", MODEL, "--request-log", path, "--quiet", NULL};
    th_daemon_start(&d, args, 30000);
    one_request(d.sock);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0, "%s", th_daemon_output(&d));
    th_daemon_cleanup(&d);
}

#define FRAGMENT "{\"req\":7,\"arrival_us\":1200,\"prompt_tok"

Test(logs, a_torn_tail_stays_a_line_of_its_own)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *path = th_path(d.dir, "requests.jsonl");
    write_file(path, FRAGMENT); /* what a crash mid-write leaves: no newline */
    run_logging_daemon(path);
    char *text = th_read_file(path);
    char *nl = strchr(text, '\n');
    cr_assert_not_null(nl, "no line at all: %s", text);
    *nl = 0;
    cr_expect_str_eq(text, FRAGMENT, "the fragment was glued to the next line");
    char *second = nl + 1, *end = strchr(second, '\n');
    cr_assert_not_null(end, "the next run's line is missing or unterminated: %s", second);
    json_error_t e;
    json_t *v = json_loadb(second, (size_t)(end - second), 0, &e);
    cr_expect_not_null(v, "the next run's first line is not JSON (%s): %.*s", e.text,
                       (int)(end - second), second);
    json_decref(v);
    free(text);
    free(path);
    th_daemon_cleanup(&d);
}

Test(logs, readers_skip_a_torn_line_and_say_so)
{
    th_daemon d = {0};
    th_daemon_init(&d);
    char *log = th_path(d.dir, "run.jsonl"), *path = th_path(d.dir, "requests.jsonl");
    th_daemon r = {0};
    const char *args[] = {"--model", MODEL, "--request-log", log, "--quiet", NULL};
    th_daemon_start(&r, args, 30000);
    one_request(r.sock);
    one_request(r.sock);
    cr_expect_eq(th_daemon_stop(&r, SIGTERM, 10000), 0, "%s", th_daemon_output(&r));
    th_daemon_cleanup(&r);
    /* The log as a crash between its two lines and fmt_log_open at the restart leave it. */
    char *text = th_read_file(log), *nl = strchr(text, '\n');
    cr_assert(nl && nl[1], "two lines expected: %s", text);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%.*s%s\n%s", (int)(nl + 1 - text), text, FRAGMENT, nl + 1);
    fclose(f);
    free(text);
    free(log);
    char *prog = th_program("ringlm-sim");
    char *argv[] = {prog, "--trace", path, "--json", NULL}, *out, *err;
    int rc = th_run(argv, &out, &err, 120);
    cr_expect_eq(rc, 0, "ringlm-sim on a log with a torn line: exit %d: %s", rc, err);
    cr_expect(strstr(err, "skipped 1 torn line"), "the torn line is not reported: %s", err);
    json_t *j = json_loads(out, 0, NULL);
    json_t *tr = j ? json_object_get(json_array_size(j) ? json_array_get(j, 0) : j, "trace") : NULL;
    cr_expect_eq(json_integer_value(json_object_get(tr, "requests")), 2,
                 "both runs' requests are read: %s", out);
    json_decref(j);
    free(out);
    free(err);
    free(prog);
    free(path);
    th_daemon_cleanup(&d);
}

Test(logs, a_torn_line_is_told_from_a_bad_one)
{
    cr_expect(fmt_json_line_torn(FRAGMENT, strlen(FRAGMENT)));
    cr_expect(fmt_json_line_torn("{", 1));
    const char *glued = FRAGMENT "{\"req\":8}";
    cr_expect(!fmt_json_line_torn(glued, strlen(glued)), "a glued line is bad, not torn");
    cr_expect(!fmt_json_line_torn("{\"req\":8}", 9), "a whole object is not torn");
    cr_expect(!fmt_json_line_torn("TIMESTAMP,", 10));
}

/* ---- descriptors ------------------------------------------------------------------------ */

/* An echo ringlmd whose open files limit (soft and hard) is nofile, as a host configured
 * with a low LimitNOFILE= runs it; listening when this returns. */
static void start_limited(th_daemon *d, unsigned nofile)
{
    th_daemon_init(d);
    char *prog = th_program("ringlmd");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        close_range(3, ~0u, 0);
        struct rlimit rl = {.rlim_cur = nofile, .rlim_max = nofile};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
        execl(prog, prog, "--echo", "--numa-node", "off", "--socket", d->sock, (char *)NULL);
        _exit(127);
    }
    d->pid = pid;
    free(prog);
    uint64_t deadline = th_now_ms() + 10000;
    for (;;) {
        int fd = th_unix_connect(d->sock, false);
        if (fd >= 0) {
            close(fd);
            return;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            d->pid = 0;
            cr_assert_fail("ringlmd exited at start: %s", th_daemon_output(d));
        }
        cr_assert_lt(th_now_ms(), deadline, "ringlmd not listening: %s", th_daemon_output(d));
        th_pause_ms(5);
    }
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

Test(fds, a_newcomer_past_the_descriptor_limit_is_refused_at_once)
{
    th_daemon d = {0};
    start_limited(&d, 128);
    enum { MAX_TRY = 200 };
    ringlm_client *cs[MAX_TRY];
    int n = 0, rc = 0;
    uint64_t took = 0;
    for (int i = 0; i < MAX_TRY; i++) {
        uint64_t t0 = th_now_ms();
        rc = ringlm_connect(d.sock, &cs[n]);
        took = th_now_ms() - t0;
        if (rc < 0) break;
        n++;
    }
    char detail[256];
    snprintf(detail, sizeof detail, "%s", ringlm_errdetail());
    cr_expect_lt(rc, 0, "%d sessions on a daemon of 128 descriptors", n);
    cr_expect_lt(took, 1000, "the refusal after %d sessions took %llu ms: %s", n,
                 (unsigned long long)took, detail);
    cr_expect(strstr(detail, "limit"), "the refusal does not say why: %s", detail);
    /* Newcomers at the limit keep being answered at once. */
    for (int i = 0; i < 20; i++) {
        ringlm_client *c = NULL;
        uint64_t t0 = th_now_ms();
        int r = ringlm_connect(d.sock, &c);
        took = th_now_ms() - t0;
        if (r == 0) ringlm_close(c);
        cr_expect(r < 0 && took < 1000, "newcomer %d at the limit: rc %d after %llu ms", i, r,
                  (unsigned long long)took);
    }
    /* A session that ends makes room for the next. */
    ringlm_close(cs[--n]);
    int r = -1;
    uint64_t deadline = th_now_ms() + 5000;
    while (r < 0 && th_now_ms() < deadline) {
        ringlm_client *c = NULL;
        if ((r = ringlm_connect(d.sock, &c)) == 0)
            cs[n++] = c;
        else
            th_pause_ms(20);
    }
    cr_expect_eq(r, 0, "no room after a session ended: %s", ringlm_errdetail());
    for (int i = 0; i < n; i++) ringlm_close(cs[i]);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    const char *out = th_daemon_output(&d);
    cr_expect(strstr(out, "open files limit 128"), "the limits are not said at start: %s", out);
    cr_expect_leq(count_of(out, "Too many open files"), 2, "the log is not rate-limited: %s", out);
    th_daemon_cleanup(&d);
}

/* ---- doorbells -------------------------------------------------------------------------- */

/* The daemon's CPU time (user + system) so far, in ms, from /proc. */
static double cpu_ms(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    char *st = th_read_file(path), *p = strrchr(st, ')');
    unsigned long long ut = 0, stime = 0;
    /* fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime */
    if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stime);
    free(st);
    return (double)(ut + stime) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* How often the daemon's loop thread (its main thread) went to sleep and was woken. */
static long loop_wakes(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)pid, (int)pid);
    char *st = th_read_file(path), *p = strstr(st, "voluntary_ctxt_switches:");
    long n = p ? atol(p + strlen("voluntary_ctxt_switches:")) : -1;
    free(st);
    return n;
}

/* A client of uid 65534 that completes the handshake, then rings its doorbell in a loop
 * without ever writing a record (it says so on ready), until stop is readable. Speaks the wire protocol itself:
 * libringlm rings only with work. */
static pid_t doorbell_ringer(const char *sock, const int stop[2], int ready)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(stop[1]); /* the parent's end: its close tells this one to stop */
    if (setgid(NOBODY_UID) != 0 || setuid(NOBODY_UID) != 0) _exit(126);
    int fd = th_unix_connect(sock, false);
    if (fd < 0) _exit(2);
    struct ringlm_wire_hello h = {.magic = RINGLM_WIRE_MAGIC, .abi = RINGLM_WIRE_ABI};
    if (send(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) _exit(3);
    struct ringlm_wire_welcome w;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = &w, .iov_len = sizeof w};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl};
    if (recvmsg(fd, &msg, 0) != (ssize_t)sizeof w || w.status != 0) _exit(4);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (!c) _exit(5);
    int fds[3];
    memcpy(fds, CMSG_DATA(c), sizeof(int) * ((c->cmsg_len - CMSG_LEN(0)) / sizeof(int)));
    struct ringlm_wire_cseg *cs =
        mmap(NULL, w.cseg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (cs == MAP_FAILED) _exit(6);
    int efd = w.doorbell_mode == RINGLM_WIRE_DB_EVENTFD ? fds[2] : -1;
    if (write(ready, "r", 1) != 1) _exit(8);
    while (!th_readable(stop[0], 0)) {
        for (int i = 0; i < 64; i++) {
            if (efd >= 0) {
                uint64_t one = 1;
                if (write(efd, &one, sizeof one) < 0) _exit(7);
            } else {
                __atomic_add_fetch(&cs->doorbell, 1, __ATOMIC_RELEASE);
                syscall(SYS_futex, &cs->doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
            }
        }
    }
    _exit(0);
}

Test(doorbell, an_idle_session_ringing_in_a_loop_does_not_take_the_loop)
{
    need_root();
    th_daemon d = {0};
    th_daemon_init(&d);
    chmod(d.dir, 0755);
    const char *args[] = {"--echo", NULL};
    th_daemon_start(&d, args, 10000);
    int stop[2], ready[2];
    cr_assert_eq(pipe(stop), 0);
    cr_assert_eq(pipe(ready), 0);
    pid_t ringer = doorbell_ringer(d.sock, stop, ready[1]);
    cr_assert(th_readable(ready[0], 10000), "the ringer did not get its session");
    /* Measured over 2 s of ringing: the loop's CPU time, and how often it was woken (the
     * CPU share depends on how much of a loaded machine the ringer gets; the wakes are
     * what it costs the loop). The clock is read before the counters at the start and after
     * them at the end, so the interval divided by holds the whole interval counted: read
     * the other way round, a test process descheduled between the clock and the counters
     * (nice 10 under `make test` at load 14 gets a few percent of a CPU) counted wakes of a
     * time it did not divide by. */
    uint64_t t0 = th_now_us();
    double c0 = cpu_ms(d.pid);
    long w0 = loop_wakes(d.pid);
    th_pause_ms(2000);
    double c1 = cpu_ms(d.pid);
    long w1 = loop_wakes(d.pid);
    double secs = (double)(th_now_us() - t0) / 1e6;
    double busy = (c1 - c0) / (secs * 1e3);
    double wakes = (double)(w1 - w0) / secs;
    cr_log_info("idle doorbell ringing: %.0f loop wakes/s, %.1f%% of a core (over %.2f s)", wakes,
                100 * busy, secs);
    close(stop[1]);
    int st = th_reap(ringer, 5000);
    close(stop[0]);
    close(ready[0]);
    close(ready[1]);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the ringer failed (status 0x%x)", st);
    cr_expect_lt(wakes, 600,
                 "an idle session's doorbell woke the loop %.0f times a second (%.0f%% "
                 "of a core)",
                 wakes, 100 * busy);
    cr_expect_lt(busy, 0.2, "the loop spent %.0f%% of a core on an idle session's doorbell",
                 100 * busy);
    /* The echo service still answers. */
    int fd = th_unix_connect(d.sock, false);
    cr_expect_geq(fd, 0);
    if (fd >= 0) close(fd);
    cr_expect_eq(th_daemon_stop(&d, SIGTERM, 10000), 0);
    const char *out = th_daemon_output(&d);
    cr_expect(strstr(out, "rings its doorbell without work") && strstr(out, "uid 65534"),
              "the session is not charged for it: %s", out);
    th_daemon_cleanup(&d);
}
