/* SPDX-License-Identifier: MIT */
/*
 * tools/replay.h — `ringlm replay`: a trace (read by formats/trace.h) driven open-loop
 * against the daemon from several client processes; private to tools/.
 */
#ifndef RINGLM_TOOLS_REPLAY_H
#define RINGLM_TOOLS_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct treq {
    int64_t arrival_us;     /* replay time (after window shift and rate scaling) */
    uint32_t prompt_tokens; /* after length scaling */
    uint32_t max_tokens;
    int64_t cancel_after_us; /* relative to submit; -1 none */
    int64_t deadline_us;     /* relative to submit; 0 none */
    int tenant;              /* index into tenant names; -1 = no tag */
    int cls;                 /* index into class names; -1 = default */
} treq;

typedef struct names {
    char **v;
    int n;
} names;

typedef struct trace {
    treq *r;
    size_t n, cap;
    names tenants, classes;
} trace;

typedef struct load_opts {
    int fmt;                             /* enum fmt_trace_format */
    double rate;                         /* arrival-rate multiplier */
    double length_scale;                 /* multiplier on prompt and output lengths */
    double window_start_s, window_len_s; /* trace-time window; len <= 0: to the end */
    long limit;                          /* max requests (0 = all) */
    long max_context;                    /* clip prompt + output to this (0 = no clipping) */
    names *force_tenants;                /* round-robin tenants (overrides the trace's) */
    const char *force_class;
} load_opts;

typedef struct rrec {
    uint32_t idx;   /* trace index; UINT32_MAX = the child could not connect */
    int32_t status; /* 0, or the -errno of submit / the session */
    int64_t submit_us, first_us, finish_us; /* since the common start; -1 = never */
    uint32_t n_tokens;
    int32_t finish_reason, reject_reason;
} rrec;

typedef struct replay_opts {
    const char *http_url; /* --http: drive ringlm-gateway at this URL instead of the socket */
    const char *api_keys; /* --api-keys (with --http): KEY TENANT [CLASS] lines, the key of
                             * each request's tenant is sent as its Bearer token */
    int clients;
    int vocab;              /* synthetic prompt ids are drawn from [3, vocab) */
    double drain_timeout_s; /* after the last arrival */
    float temperature;
    uint64_t seed;
} replay_opts;

/* Index of s in ns, added when new. */
int replay_name_index(names *ns, const char *s);
void replay_free_names(names *ns);
/* Reads the trace at path (any format of formats/trace.h) and applies lo: window, rate,
 * lengths, tenants and class; ends the command on a malformed line. */
void replay_load_trace(const char *path, const load_opts *lo, trace *t);
/* Client process k: connects, submits its share of t (every ro->clients-th request) at its
 * arrival time from t0, writes one rrec per request to fd, exits. Never returns. */
void replay_child_main(int k, const trace *t, const replay_opts *ro, uint64_t t0, int fd)
    __attribute__((noreturn));
/* The synthetic prompt of trace request idx (n ids, BOS first, the rest drawn from
 * [3, vocab) by the seed): the same whichever path replays it. Returns the request's seed. */
uint64_t replay_prompt(const replay_opts *ro, size_t idx, uint32_t n, int32_t *ids);
/* Writes one result to the parent (a dead parent ends the child). */
void replay_put_rec(int fd, const rrec *r);
/* Checks --http URL and --api-keys before the children start (the trace's tenants each need
 * a key when a keys file is given); ends the command with the reason. */
void replay_http_check(const replay_opts *ro, const trace *t);
/* The --http client process k: as replay_child_main, each request a POST /v1/completions
 * (prompt as token ids, streamed) on its own connection; never returns. */
void replay_http_child_main(int k, const trace *t, const replay_opts *ro, uint64_t t0, int fd)
    __attribute__((noreturn));
/* The subcommand: argc/argv from "replay" on. Returns the exit status. */
int replay_main(int argc, char **argv);

#endif
