/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_server.h — ringlm-gateway's HTTP server: OpenAI-compatible endpoints served by
 * libmicrohttpd, every request a ringlm request on one of its shared-memory sessions with
 * ringlmd.
 *
 * THREADS
 *   http    libmicrohttpd's internal polling thread (epoll): HTTP heads and bodies, the
 *           small endpoints; streams sit suspended (no thread per stream) until the
 *           event thread has bytes for them.
 *   prep    --tokenize-threads of them: parse the JSON body, apply the chat template,
 *           tokenize, submit (one big prompt never stalls the http thread).
 *   guard   head and body deadlines of the connections.
 *   events  one per session, owns it: ringlm_next_event, turns tokens into text and SSE
 *           chunks, resumes the streams that have something to send; reconnects when the
 *           daemon goes away.
 *   watch   epoll on the sockets of suspended requests: a client that hangs up while its
 *           request waits or generates is cancelled at once (libmicrohttpd does not look at
 *           a suspended connection's socket).
 *   One mutex guards the requests and the submit side of the sessions (ringlm.h: one
 *   thread submits/cancels while another reads events).
 */
#ifndef RINGLM_TOOLS_GW_SERVER_H
#define RINGLM_TOOLS_GW_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "ringlm.h"
#include "formats/api_keys.h"

/* Connections libmicrohttpd may hold beyond max_connections: those cut for a deadline or
 * evicted that its thread has not closed yet (file descriptors to reserve). */
#define GW_CUT_SLACK 64

typedef struct gw_cfg {
    const char *listen_addr; /* IPv4 or IPv6 literal; NULL = 127.0.0.1 */
    uint16_t port;           /* 0 = any (gw_server_port tells which) */
    const char *socket_path; /* ringlmd's socket (NULL: $RINGLM_SOCKET, default) */
    /* Several daemons (--socket given more than once, one ringlmd per NUMA node): their
     * sockets; each gets `sessions` sessions, and gw_route.h picks one per request. n 0:
     * socket_path alone. */
    const char *const *sockets;
    unsigned n_sockets;
    uint32_t affinity_block_tokens; /* gw_route.h (0: 16) */
    const ringlm_tokenizer *tok;
    const gw_keys *keys; /* NULL: no keys, every request is the gateway's tenant */
    int tpl;             /* RINGLM_CHAT_*: the chat template of /v1/chat/completions */
    const struct ringlm_chat_jinja *jinja; /* the model file's own template (NULL: tpl) */
    /* /v1/models id, and the name requests must use; NULL: the name the daemons say
     * (ringlm_served_model; "ringlm" until one does, or with a daemon that does not) */
    const char *served_model;
    int reasoning;                     /* GW_REASON_*: reasoning_content split off chat answers */
    int tool_parser;                   /* GW_TOOLS_*: the model's tool-call syntax (0: none) */
    uint32_t max_model_len;            /* context in tokens (0 = unknown) */
    size_t max_body_bytes;             /* larger bodies: 413 */
    unsigned http_timeout_s;           /* idle connection (slow header/body) timeout */
    unsigned http_head_timeout_s;      /* a whole request head within this (0: none) */
    unsigned http_body_timeout_s;      /* the whole body within this of the head (0: none) */
    unsigned max_connections;          /* at the limit a newcomer evicts the oldest slow head */
    unsigned max_connections_per_addr; /* 0: no bound */
    unsigned sessions;                 /* shm sessions with ringlmd, 1..64 (0 = 1) */
    unsigned prep_threads;             /* threads that parse and tokenize (0 = 1) */
    unsigned prep_queue;               /* requests waiting for one; more: 503 */
    const char *daemon_metrics; /* ringlmd's --metrics ADDR:PORT: its vllm:* on our /metrics */
    int quiet;
} gw_cfg;

typedef struct gw_server gw_server;

/* Starts listening and connecting (the daemon may come later: /health says 503 until then).
 * Returns 0, or -errno with a message on stderr. */
int gw_server_start(const gw_cfg *cfg, gw_server **out);
uint16_t gw_server_port(const gw_server *s);
/* Drain: no new requests (503, /health 503), the listening socket closed; requests in
 * flight finish, or are cancelled after grace_ms. Returns when none is left. */
void gw_server_drain(gw_server *s, unsigned grace_ms);
/* Stops the threads and frees everything. Returns 0, or -EBUSY when a tokenizer thread was
 * still busy after 2 s (a tokenization cannot be interrupted): then nothing is freed, and
 * neither must the caller free the tokenizer or the keys — only exit. */
int gw_server_stop(gw_server *s);

#endif
