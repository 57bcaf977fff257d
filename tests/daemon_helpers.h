/* SPDX-License-Identifier: MIT */
/*
 * tests/daemon_helpers.h — what the ringlmd end-to-end suites (tests/test_daemon_*.c) share, on
 * top of tests/helpers.h: a real daemon process on a private socket with its stats file,
 * decision and request logs (dmn), real client processes (fork + libringlm) that submit,
 * read and write what they saw to a file, and the check that every KV block is accounted
 * for (used + free = total per tier, scheduler invariants) through the daemon's
 * --stats-file. Every test stops every process it starts.
 */
#ifndef RINGLM_TESTS_DAEMON_HELPERS_H
#define RINGLM_TESTS_DAEMON_HELPERS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "ringlm.h"
#include "shm/wire.h"
#include "tests/helpers.h"

/* ---- harness ------------------------------------------------------------------------- */

typedef struct dmn {
    th_daemon th; /* tests/helpers.c starts and stops it */
    char dir[64];
    char sock[128], stats[128], declog[128], reqlog[128], errlog[128], policy[128];
    char out[160]; /* a client's output (dmn_start_for) */
    pid_t pid;
} dmn;

/* The real stories260K checkpoint's path in out; false when it is absent. */
bool stories_path(char *out, size_t n);

/* Scenarios that compare no tokens run on the synthetic stories260K shape when the real
 * checkpoint is absent. */
void model_or_synthetic(char *out, size_t n);

/* Skips the test when ringlmd is not built. */
void need_daemon_binary(void);

/* The first 60 lines of a file to stderr, under a title (a failing test's evidence). */
void dump_file(const char *path, const char *what);

/* How long dmn_start waits for a daemon to listen and write its stats file. */
#define DMN_START_MS 100000

/* An extra option for a test whose assertion needs its clients to act while the daemon still
 * works (submit more, be killed mid-prefill, see a first token when it comes): ringlmd then
 * runs at nice 19. By default it takes nice -10 (these tests run as root), 20 levels above
 * the clients under `nice -n 10 make test`, and on a loaded machine it finished the work
 * before a client woke — not what the test was about. At 19 a woken client preempts it. */
#define DMN_BELOW_CLIENTS "--nice", "19"

/* Starts ringlmd (tests/helpers.c) with its stats file and logs in its private directory;
 * returns once its socket answers and its stats file exists. */
void dmn_start(dmn *d, const char *model, const char *policy_text, const char *const *extra);

/* Sends sig and waits up to timeout_ms for exit; SIGKILL after. Returns the exit status
 * (or 128+signal). */
int dmn_stop(dmn *d, int sig, int timeout_ms);

/* Kills a daemon still running and removes its directory. */
void dmn_cleanup(dmn *d);

/* The daemon's stats file as JSON (json_decref it); NULL when it cannot be read. */
json_t *dmn_stats(dmn *d);

/* The daemon's /metrics port, from its "metrics on port N" line (0: none). */
int dmn_metrics_port(const dmn *d);

/* The integer at a dotted path ("a.b.c") of o; -1 when there is none. */
long long jint(json_t *o, const char *path);

/* Waits until every request is gone and no KV block is used in any tier; asserts the
 * accounting identity and the scheduler's invariants on the way. */
void assert_back_to_baseline(dmn *d, int timeout_ms);

/* Forks a client process running fn(arg); returns its pid. */
pid_t spawn(int (*fn)(void *), void *arg);

/* Waits up to timeout_ms for a client process: its exit status (128+signal), 999 when it
 * had to be killed. */
int reap(pid_t p, int timeout_ms);

/* ---- reference greedy cases ---------------------------------------------------------- */

typedef struct ref_case {
    int32_t prompt[16];
    uint32_t n_prompt;
    int32_t gen[600];
    uint32_t n_gen;
    bool stops;
    uint32_t max_new;
} ref_case;

/* The reference greedy cases (shared/models/reference-greedy.json) into out: how many. */
int load_refs(ref_case *out, int max);

typedef struct gen_job {
    const char *sock;
    const ref_case *cases;
    int n_cases;
    const char *class_name;
    const char *tenant;
} gen_job;

/* Client process: submits every case at once (one mixed batch), checks each stream against
 * the reference token by token. Exit 0 when all match. */
int client_greedy(void *arg);

/* Lines of a file holding needle; -1 when it cannot be read. */
int count_lines(const char *path, const char *needle);

/* ---- generic load client ------------------------------------------------------------- */

typedef struct load_job {
    const char *sock;
    const char *tenant; /* tenant tag (trusted uid) or NULL */
    const char *class_name;
    int n_requests;       /* total to submit (0 = until duration_ms) */
    int concurrency;      /* closed loop: requests in flight */
    uint64_t interval_us; /* open loop: one submit per interval (0 = closed loop) */
    uint64_t duration_ms; /* stop submitting after this long (0 = no limit) */
    uint64_t start_at_us; /* CLOCK_MONOTONIC µs to start at (0 = now) */
    uint32_t prompt_len, max_new;
    int32_t token_base;
    int vocab;
    const char *out_path;        /* one line per request */
    int ready_fd;                /* write one byte after the first token (or -1) */
    uint64_t deadline_us;        /* per request, relative (0 = none) */
    const int32_t *fixed_prompt; /* this prompt (prompt_len tokens) for every request */
    bool never_read;             /* submit, then stop reading (backpressure) */
    int wait_fd;                 /* never_read: read one byte here before reading events */
    int gate_after, gate_fd;     /* after this many submits (0: never), read one byte at gate_fd */
} load_job;

typedef struct req_rec {
    uint64_t id, submit_us, first_us, end_us;
    uint32_t n_tokens, next_index;
    int reason, cause;
    bool done, index_error;
} req_rec;

/* Client process: submits as load_job says and writes one result_line a request to
 * out_path. Exit 0 unless a call failed. */
int client_load(void *arg);

typedef struct result_line {
    int reason, cause;
    unsigned n_tokens;
    long long ttft_us, e2e_us;
    unsigned long long submit_us;
    int index_error, done;
} result_line;

/* client_load's output file into out: how many lines. */
int read_results(const char *path, result_line *out, int max);

/* Prompts sent one after another on one session (each waits for the previous one's FINISH,
 * so later ones find what earlier ones cached); the tokens each stream produced, then its
 * finish reason and token count, go to a file, one line a prompt. */
#define SEQ_MAX 12

typedef struct seq_job {
    const char *sock, *out;
    int n; /* prompts */
    uint32_t max_new;
    int32_t prompt[SEQ_MAX][80];
    uint32_t n_prompt[SEQ_MAX];
    int repeat[SEQ_MAX];          /* times prompt i is sent, one after another (0: once) */
    uint32_t max_new_of[SEQ_MAX]; /* new tokens prompt i asks for (0: max_new) */
} seq_job;

/* Client process for a seq_job. */
int client_sequential(void *arg);

/* What a client process does with a request, each failure's detail on stderr.
 * client_connect: a session on the daemon's socket sock; NULL when it cannot connect (the
 * client process then exits 2). client_submit: submits r on c, its id to *id; 0, or 4 (the
 * exit code). client_follow: reads c's events up to request id's FINISH (each wait up to
 * 60 s), that event to *fin (may be NULL); with f, the request's tokens go there as "%d "
 * and its end as "| reason n_tokens" and a newline; each token is counted in *n while
 * *n < cap (n may be NULL) and, with conv, stored at conv[*n] first. 0, or 5 when no event
 * came. */
ringlm_client *client_connect(const char *sock);
int client_submit(ringlm_client *c, const ringlm_request *r, uint64_t *id);
int client_follow(ringlm_client *c, uint64_t id, FILE *f, int32_t *conv, uint32_t *n, uint32_t cap,
                  ringlm_event *fin);

/* A file's first 64 KiB (malloc()ed); NULL when it cannot be read. */
char *slurp(const char *path);

/* One side of a cache-on/off comparison: a fresh ringlmd (model, policy, flags) whose client
 * writes its output to <its dir>/out.txt — *sock and *out (the client job's) are pointed at
 * its socket and that file. */
void dmn_start_for(dmn *d, const char *model, const char *policy, const char *const *flags,
                   const char **sock, const char **out);

/* Runs the client process fn(job) to its end (exit 0), then waits for the pools' baseline. */
void dmn_run_client(dmn *d, int (*fn)(void *), void *job, const char *what);

/* Stops the daemon (SIGTERM, exit 0) and returns its client's output (free it). */
char *dmn_stop_output(dmn *d);

/* ringlm-sim replaying a daemon's request log (--trace LOG --json, then args): its JSON report
 * (json_decref it), which must have prefix_cache figures (*pc). */
json_t *sim_replay(const char *reqlog, const char *args, json_t **pc);

/* Up to 4 requests submitted as one batch, all ignore_stop; each stream's tokens, then its
 * finish reason and token count, go to the file out, one line a request. */
typedef struct px_conc_job {
    const char *sock, *out;
    int32_t prompt[4][80];
    uint32_t n_prompt[4];
    int n;            /* requests (0: 4) */
    uint32_t max_new; /* new tokens each (0: 200) */
} px_conc_job;

int client_px_concurrent(void *arg);

/* Lines of a log holding both needles. */
int count_lines2(const char *path, const char *a, const char *b);

/* The first decision-log line holding both needles (static buffer; "" when none). */
const char *find_line2(const char *path, const char *a, const char *b);

/* The number after "key": in a JSON line; -1 when the key is absent. */
double json_num_of(const char *line, const char *key);

/* A session opened by hand (the handshake without libringlm), for tests that write records
 * straight into the submit ring: its segments mapped, at = the ring's producer position. */
typedef struct th_raw {
    int sock, dfd;
    struct ringlm_wire_welcome w;
    struct ringlm_wire_cseg *cseg;
    const struct ringlm_wire_dseg *dseg;
    uint64_t at;
} th_raw;
void th_raw_connect(const char *path, th_raw *r);
void th_raw_close(th_raw *r);

#endif
