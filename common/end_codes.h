/* SPDX-License-Identifier: MIT */
/*
 * common/end_codes.h — the one table of how a request ends: finish reasons (< 16) and causes
 * (>= 16: why it was rejected, cancelled or failed).  Every spelling of an end code comes from
 * the one list below, END_CODES:
 *
 *   - the wire's enum ringlm_wire_reason (RINGLM_WIRE_R_<SUFFIX>, shm/wire.h) and its names
 *     (ringlm_wire_reason_name);
 *   - the scheduler's enum sched_end_code (SCHED_END_<SUFFIX>, sched/sched.h) and its names
 *     (sched_end_name), which the daemon, the simulator and the request logs use;
 *   - the public values of ringlm.h (RINGLM_FINISH_<SUFFIX> below 16, RINGLM_R_<SUFFIX> from
 *     16) and ringlm_reason_name.
 *
 * ringlm.h is installed alone (`make install` copies that one file), so it cannot include this
 * header, and common/ may not include libclient/.  Its block of values is therefore generated
 * from this list by scripts/gen-end-codes.sh (`make gen-end-codes`), and `make test` fails
 * while the generated block and this list disagree (`make check-end-codes`).  That one check
 * replaces the chains of _Static_asserts that used to keep four hand-written copies equal.
 *
 * A value is ABI: it crosses the wire and is compiled into clients.  Never renumber or reuse
 * one; a new code takes a new number (a client built before it names it "unknown").
 *
 * Header only and libc only (common/ is below every folder).
 */
#ifndef RINGLM_COMMON_END_CODES_H
#define RINGLM_COMMON_END_CODES_H

/* X(SUFFIX, value, "name", "what it means for the client") */
#define END_CODES(X)                                                                               \
    X(NONE, 0, "none", "no reason, or no cause beyond the finish reason")                          \
    X(LENGTH, 1, "length", "max_new_tokens generated, or the context is full")                     \
    X(STOP, 2, "stop", "a stop token was generated")                                               \
    X(CANCELLED, 3, "cancelled", "cancelled by ringlm_cancel or by the daemon")                    \
    X(TIMEOUT, 4, "timeout", "its deadline or its class's queue wait passed")                      \
    X(REJECTED, 5, "rejected", "refused at admission; the cause says why")                         \
    X(ERROR, 6, "error", "the daemon failed it (engine error ...)")                                \
    X(QUEUE_FULL, 16, "queue_full", "the global queue is at its limit; retry later")               \
    X(TENANT_QUOTA, 17, "tenant_quota", "the tenant's queued-token quota is used up")              \
    X(TOO_LONG, 18, "too_long", "prompt + max_new_tokens exceed the model's context")              \
    X(DEADLINE_INFEASIBLE, 19, "deadline_infeasible", "its deadline cannot be met")                \
    X(BAD_TOKEN, 20, "bad_token", "a prompt token is outside the vocabulary")                      \
    X(BAD_PARAMS, 21, "bad_params", "parameters out of range, or a tenant not in the policy")      \
    X(DRAINING, 22, "draining", "the daemon is shutting down")                                     \
    X(OUTPUT_BACKPRESSURE, 23, "output_backpressure", "the client stopped reading its events")     \
    X(UNKNOWN_CLASS, 24, "unknown_class", "no such request class in the policy")                   \
    X(DUPLICATE_ID, 25, "duplicate_id", "the request id is already in use in this session")        \
    X(INTERNAL, 26, "internal", "a daemon-internal failure")                                       \
    X(CLIENT_GONE, 27, "client_gone", "the session ended")                                         \
    X(NEVER_FITS, 28, "never_fits", "needs more KV blocks than the pool (or tenant) can ever hold")

/* One past the largest value (checked against the list just below). */
#define END_CODES_MAX 29
#define END_CODE_BELOW_MAX(suffix, value, name, doc)                                               \
    _Static_assert((value) < END_CODES_MAX, "END_CODES_MAX is past " name);
END_CODES(END_CODE_BELOW_MAX)
#undef END_CODE_BELOW_MAX

/* The name of an end code; "unknown" for a value that is not one (the gaps included). */
static inline const char *end_code_name(unsigned code)
{
    switch (code) {
#define END_CODE_CASE(suffix, value, name, doc)                                                    \
    case value: return name;
        END_CODES(END_CODE_CASE)
#undef END_CODE_CASE
    default: return "unknown";
    }
}

#endif
