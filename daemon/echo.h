/* SPDX-License-Identifier: MIT */
/*
 * daemon/echo.h — a trivial service for transport tests and ipc_bench (`ringlmd --echo`).
 *
 * Each request is answered with max_new_tokens TOKEN events whose token ids cycle
 * through the request's prompt (prompt[i % n_prompt], index i), then FINISH(length).
 * Cancel → FINISH(cancelled); a deadline that passes → FINISH(timeout); parameters that
 * fail ringlm_wire_check_request → FINISH(rejected, bad_params).  Tokens wait while the
 * client's event ring is full (never blocks the loop).
 */
#ifndef RINGLM_DAEMON_ECHO_H
#define RINGLM_DAEMON_ECHO_H

#include "daemon/loop.h"

typedef struct echo_svc echo_svc;

/* ops to pass to dloop_create with the echo_svc as ctx. */
extern const dsvc_ops echo_ops;

int echo_create(echo_svc **out);
/* Must be called once the loop exists (timers, policy hash). */
void echo_attach(echo_svc *e, dloop *l);
void echo_destroy(echo_svc *e);
/* Requests answered so far (all sessions). */
unsigned long long echo_finished(const echo_svc *e);

#endif
