/* SPDX-License-Identifier: MIT */
/*
 * common/end_codes.h — the one table of the names of how a request ends (finish reasons and
 * reject causes), shared by the wire (shm/wire.c: ringlm_wire_reason_name, and through it
 * libclient's ringlm_reason_name), the scheduler (sched_end_name), the daemon, the
 * simulator and the request log. The numbers are the wire's RINGLM_WIRE_R_* (shm/wire.h),
 * which sched_end_code repeats value for value (_Static_asserts in daemon/requests.c and
 * sched/event.c); the names exist only here.
 *
 * Header only and libc only (common/ is below every folder).
 */
#ifndef RINGLM_COMMON_END_CODES_H
#define RINGLM_COMMON_END_CODES_H

/* X(SUFFIX, value, "name"): RINGLM_WIRE_R_<SUFFIX> and SCHED_END_<SUFFIX>. */
#define END_CODES(X)                                                                               \
    X(NONE, 0, "none")                                                                             \
    X(LENGTH, 1, "length")                                                                         \
    X(STOP, 2, "stop")                                                                             \
    X(CANCELLED, 3, "cancelled")                                                                   \
    X(TIMEOUT, 4, "timeout")                                                                       \
    X(REJECTED, 5, "rejected")                                                                     \
    X(ERROR, 6, "error")                                                                           \
    X(QUEUE_FULL, 16, "queue_full")                                                                \
    X(TENANT_QUOTA, 17, "tenant_quota")                                                            \
    X(TOO_LONG, 18, "too_long")                                                                    \
    X(DEADLINE_INFEASIBLE, 19, "deadline_infeasible")                                              \
    X(BAD_TOKEN, 20, "bad_token")                                                                  \
    X(BAD_PARAMS, 21, "bad_params")                                                                \
    X(DRAINING, 22, "draining")                                                                    \
    X(OUTPUT_BACKPRESSURE, 23, "output_backpressure")                                              \
    X(UNKNOWN_CLASS, 24, "unknown_class")                                                          \
    X(DUPLICATE_ID, 25, "duplicate_id")                                                            \
    X(INTERNAL, 26, "internal")                                                                    \
    X(CLIENT_GONE, 27, "client_gone")

/* One past the largest value. */
#define END_CODES_MAX 28

/* The name of an end code; "unknown" for a value that is not one (the gaps included). */
static inline const char *end_code_name(unsigned code)
{
    switch (code) {
#define END_CODE_CASE(suffix, value, name)                                                         \
    case value: return name;
        END_CODES(END_CODE_CASE)
#undef END_CODE_CASE
    default: return "unknown";
    }
}

#endif
