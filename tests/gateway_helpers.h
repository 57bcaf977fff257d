/* SPDX-License-Identifier: MIT */
/*
 * tests/gateway_helpers.h — what the gateway suites share, on top of tests/helpers.h: a real
 * ringlmd (th_daemon, serving stories260K with a test policy and /metrics) and a real
 * ringlm-gateway in front of it on an ephemeral port; HTTP through curl (the real client) or
 * a raw socket (for what curl cannot do: hang up mid-stream, stall mid-header); the daemon's
 * /metrics. One daemon and one gateway per test (Criterion runs each test in its own
 * process); gwh_stop_all, the suites' fini, stops both and removes their directory.
 */
#ifndef RINGLM_TESTS_GATEWAY_HELPERS_H
#define RINGLM_TESTS_GATEWAY_HELPERS_H

#include <stdbool.h>

#include "tests/helpers.h"

extern th_daemon gwh_daemon; /* its dir holds the policy, the keys and the gateway's log */
extern th_proc gwh_gateway;
extern int gwh_port;         /* the gateway's HTTP port */
extern int gwh_metrics_port; /* the daemon's /metrics port */

/* Skips the test unless ringlmd, ringlm-gateway, stories260K and tok512 are there. */
void gwh_need(void);
/* Skips the test when curl is not installed. */
void gwh_need_curl(void);
/* The daemon's directory (created on first use) and socket. */
const char *gwh_dir(void);
/* Writes the test policy (tenants shared (default), alice, bob, tiny with a 4-token queue
 * quota, held with a token rate of 0.001/s: once one request has emptied its bucket, its next
 * waits in the queue for over an hour, until cancelled; classes chat (default) and batch; this
 * uid trusted to tag tenants) and returns its path (malloc()ed). */
char *gwh_policy(void);
/* Writes the keys file (sk-alice-0001 alice, sk-bob-00001 bob batch, sk-tiny-00001 tiny,
 * sk-held-00001 held); its path (malloc()ed). */
char *gwh_keys(void);
/* How long a test waits for a ringlmd of its own to listen: a bound for a loaded machine, not
 * a speed claim. synthetic:stories110M's load and warm-up took 14 s alone at load 12 on 2
 * vCPUs, and two such daemons of one test, started beside another test, missed 20 s. */
#define GWH_DAEMON_START_MS 60000
/* ringlmd on stories260K (with its tokenizer, so it enforces constraints) with the test
 * policy, metrics on an ephemeral port; extra: NULL-terminated further options (may be NULL;
 * one that names another --model drops the tokenizer). Fails the test when it does not listen
 * within GWH_DAEMON_START_MS. */
void gwh_start_daemon(const char *const *extra);
/* ringlmd options (in gwh_start_daemon's extra): --nice 19, so ringlmd and all its threads
 * (its BLAS pool too) run at the lowest nice, below the test and the gateway. Without it
 * ringlmd raises itself to nice -10 where permitted (these tests run as root), 20 levels
 * above everything `nice -n 10 make test` starts. For a test whose client hangs up while its
 * request generates and that asserts the request was cancelled (gateway_e2e's
 * disconnect_mid_stream_cancels_and_frees_blocks): at -10 on a loaded machine ringlmd
 * finished the whole story (stories260K: 12-130 ms) before the hang-up, the gateway's watch
 * thread and its ringlm_cancel got the CPU, and the requests ended "stop" (19 of 21 runs
 * failed at load 11); at 19 each of them preempts ringlmd when it wakes. They all share the
 * test's session and so its autogroup, within which the nice ranks them (ringlmd gives an
 * autogroup its nice only when it leads its own session). */
#define GWH_DAEMON_BELOW_CLIENTS "--nice", "19"

/* ringlm-gateway on 127.0.0.1:0 (the port it prints goes to gwh_port), with
 * --served-model-name gwh_served_model ("stories"; NULL: none, the daemon's name); extra:
 * further options, NULL-terminated (may be NULL). Does not wait for its session. */
extern const char *gwh_served_model;
void gwh_start_gateway(const char *const *extra);
/* Waits until the gateway's /health is 200 (its session is up). */
void gwh_wait_healthy(int timeout_ms);
/* Stops the gateway and the daemon (SIGTERM) and removes the directory. */
void gwh_stop_all(void);

/* stories260K's tokenizer (tok512.bin) as a GGUF SentencePiece vocabulary of the same 512
 * pieces, with tokenizer.chat_template when template is not NULL, written in the daemon's
 * directory as name: a gateway given it (--tokenizer) renders chats with that template
 * and its ids are the model's. The path (malloc()ed). */
char *gwh_stories_gguf(const char *name, const char *template);
/* The same with tokenizer.ggml.add_bos_token and add_eos_token (-1: the key is left out). */
char *gwh_stories_gguf_special(const char *name, const char *template, int add_bos, int add_eos);

/* ringlmd, and a gateway whose tokenizer is stories260K's vocabulary with chat template
 * jinja (gwh_stories_gguf(file, jinja)), extra: more gateway options (may be NULL); waits
 * until it is healthy. For the tool-call suites: the template decides the call syntax. */
void gwh_start_with_template(const char *file, const char *jinja, const char *const *extra);

/* Runs `node --test tests/node/<script>` against the gateway (GATEWAY_URL set, NO_WS_BIAS
 * the whitespace bias as JSON) and asserts it passed with `passes` checks; skips when node or
 * the openai package is not installed. */
void gwh_run_node_sdk_test(const char *script, int passes);

/* logit_bias {"id": -100, ...} for each of stories260K's tokens that is only whitespace: a JSON
 * answer may put whitespace anywhere, and a greedy stories260K stays there (a new reference). */
struct json_t;
struct json_t *gwh_whitespace_bias(void);

typedef struct gwh_resp {
    int status;
    char *head; /* status line and headers */
    char *body;
} gwh_resp;
/* curl -s -i -N [-H 'Authorization: Bearer KEY'] [--data-binary BODY] to the gateway;
 * key NULL: none; body NULL: a GET. */
gwh_resp gwh_curl(const char *path, const char *key, const char *body);
void gwh_resp_free(gwh_resp *r);

/* A raw connection to the gateway; a POST written on it (Connection: close). */
int gwh_connect(void);
void gwh_send_post(int fd, const char *path, const char *key, const char *body);

/* The daemon's /metrics (malloc()ed). */
char *gwh_daemon_metrics(void);
/* The gateway's /metrics (malloc()ed). */
char *gwh_gateway_metrics(void);
/* The value of the sample `series` (exact name and labels); 0 when there is none. */
double gwh_metric(const char *text, const char *series);

/* A row of one of docs/gateway.md's field tables: the field, the endpoints it applies to
 * (empty where the table has no such column), its status, an example value and the value a
 * refused field is accepted at. */
typedef struct gwh_doc_row {
    char name[48], endpoints[16], status[16], example[128], accepted[32];
} gwh_doc_row;
/* The rows of docs/gateway.md's table between "<!-- TABLE table" and "<!-- end of the TABLE
 * table" (at most max; at least one); with_endpoints: its second column is the endpoints.
 * Skips the test when docs/gateway.md is not found (run from the repository root). */
int gwh_doc_rows(const char *table, bool with_endpoints, gwh_doc_row *rows, int max);

#endif
