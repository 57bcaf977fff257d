/* SPDX-License-Identifier: MIT */
/*
 * ringlm.h — the ringlm client library.
 *
 * A client process on the same host as ringlmd submits token work through a lock-free
 * ring in shared memory and reads token events from another; no socket round trip per
 * token.  Link with -lringlm (pkg-config ringlm).
 *
 * LIFECYCLE
 *   ringlm_client *c;
 *   ringlm_connect(NULL, &c);                  socket: arg, else $RINGLM_SOCKET, else
 *                                              RINGLM_DEFAULT_SOCKET
 *   ringlm_request r; ringlm_request_init(&r); r.prompt = ids; r.n_prompt = n;
 *   uint64_t id; ringlm_submit(c, &r, &id);    any number in flight
 *   ringlm_event ev;
 *   while (ringlm_next_event(c, &ev, -1) == 1) {
 *       if (ev.kind == RINGLM_EV_TOKEN) ... ev.token ...
 *       if (ev.kind == RINGLM_EV_FINISH && ev.req_id == id) break;
 *   }
 *   ringlm_close(c);
 *
 * Every request ends with exactly one RINGLM_EV_FINISH event (after its tokens), whatever
 * happens to it: finished, cancelled, timed out or rejected, unless the session itself
 * ends, which next_event reports as an error after the events already published.
 *
 * THREAD-SAFETY
 *   A ringlm_client is used by one thread at a time, with one exception: one thread may
 *   submit/cancel while another thread calls ringlm_next_event on the same client (the
 *   two sides of the session share no mutable state).  ringlm_close must not race with
 *   anything.  Distinct clients are independent.  ringlm_errdetail() is thread-local.
 *
 * ERRORS
 *   Functions return 0 (or a count) on success and a negative errno value on failure;
 *   ringlm_strerror(err) names the errno, ringlm_errdetail() explains the last failure
 *   of the calling thread ("daemon speaks ABI 2, this library ABI 1").
 *
 * FORK
 *   A child process must not use its parent's client; connect anew in the child.
 */
#ifndef RINGLM_H
#define RINGLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* This header is self-contained (installed alone); the values equal shm/wire.h's
 * RINGLM_WIRE_R_* codes, checked at build time in libclient/client.c. */

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header and library (semantic versioning: a MAJOR change breaks source or
 * binary compatibility; the shared library's soname is libringlm.so.MAJOR). Compare with
 * ringlm_version() at run time to detect a library older than the header built against. */
#define RINGLM_VERSION_MAJOR 0
/* 0.2: n_cached_tokens; 0.3: request check, tokenizer; 0.4: sampling extensions; 0.5: the
 * daemon's served model name and load, constrained samples; 0.6: ringlm_wake */
#define RINGLM_VERSION_MINOR 6
#define RINGLM_VERSION_PATCH 0
/* One number that orders versions: MAJOR*10000 + MINOR*100 + PATCH. */
#define RINGLM_VERSION_NUMBER                                                                      \
    (RINGLM_VERSION_MAJOR * 10000 + RINGLM_VERSION_MINOR * 100 + RINGLM_VERSION_PATCH)

/* Socket path when neither the argument nor $RINGLM_SOCKET names one.  ringlmd uses the
 * same rule for --socket. */
#define RINGLM_DEFAULT_SOCKET "/run/ringlm/ringlmd.sock"
#define RINGLM_SOCKET_ENV     "RINGLM_SOCKET"

/* ---- end codes: generated from common/end_codes.h by scripts/gen-end-codes.sh ---- */
/* Finish reasons (ringlm_event.finish_reason). */
/* "length": max_new_tokens generated, or the context is full */
#define RINGLM_FINISH_LENGTH         1
/* "stop": a stop token was generated */
#define RINGLM_FINISH_STOP           2
/* "cancelled": cancelled by ringlm_cancel or by the daemon */
#define RINGLM_FINISH_CANCELLED      3
/* "timeout": its deadline or its class's queue wait passed */
#define RINGLM_FINISH_TIMEOUT        4
/* "rejected": refused at admission; the cause says why */
#define RINGLM_FINISH_REJECTED       5
/* "error": the daemon failed it (engine error ...) */
#define RINGLM_FINISH_ERROR          6
/* Causes (ringlm_event.reject_reason): why a request was rejected, or the daemon-side
 * cause of a cancel/timeout/error when there is one; 0 otherwise. */
/* "queue_full": the global queue is at its limit; retry later */
#define RINGLM_R_QUEUE_FULL          16
/* "tenant_quota": the tenant's queued-token quota is used up */
#define RINGLM_R_TENANT_QUOTA        17
/* "too_long": prompt + max_new_tokens exceed the model's context */
#define RINGLM_R_TOO_LONG            18
/* "deadline_infeasible": its deadline cannot be met */
#define RINGLM_R_DEADLINE_INFEASIBLE 19
/* "bad_token": a prompt token is outside the vocabulary */
#define RINGLM_R_BAD_TOKEN           20
/* "bad_params": parameters out of range, or a tenant not in the policy */
#define RINGLM_R_BAD_PARAMS          21
/* "draining": the daemon is shutting down */
#define RINGLM_R_DRAINING            22
/* "output_backpressure": the client stopped reading its events */
#define RINGLM_R_OUTPUT_BACKPRESSURE 23
/* "unknown_class": no such request class in the policy */
#define RINGLM_R_UNKNOWN_CLASS       24
/* "duplicate_id": the request id is already in use in this session */
#define RINGLM_R_DUPLICATE_ID        25
/* "internal": a daemon-internal failure */
#define RINGLM_R_INTERNAL            26
/* "client_gone": the session ended */
#define RINGLM_R_CLIENT_GONE         27
/* "never_fits": needs more KV blocks than the pool (or tenant) can ever hold */
#define RINGLM_R_NEVER_FITS          28
/* ---- end of the generated end codes ---- */
#define RINGLM_R_INFEASIBLE_DEADLINE RINGLM_R_DEADLINE_INFEASIBLE /* old spelling, kept */

/* Lower-case name of a finish reason or cause ("length", "queue_full"); "unknown" else. */
const char *ringlm_reason_name(int code);

typedef struct ringlm_client ringlm_client; /* opaque */

typedef struct ringlm_request {
    const int32_t *prompt; /* prompt token ids (required, n_prompt >= 1) */
    uint32_t n_prompt;
    uint32_t max_new_tokens; /* [1, 2^28 - 1] */
    float temperature;       /* [0, 100], 0 = greedy */
    uint32_t top_k;          /* 0 = off */
    float top_p;             /* (0, 1], 1 = off */
    uint64_t seed;           /* sampling seed */
    uint64_t deadline_us;    /* relative to the submit call, at most a year; 0 = none */
    const char *class_name;  /* request class, < 16 bytes; NULL = "default" */
    const char *tenant_tag;  /* < 16 bytes; only honoured for uids the daemon trusts
	                              (a gateway); NULL = none */
    bool ignore_stop;        /* true: the model's stop token does not end the request,
	                              which generates exactly max_new_tokens (unless the context
	                              is full; for benchmarks, as vLLM's ignore_eos) */
} ringlm_request;

/* Fills defaults: max_new_tokens 16, temperature 0 (greedy), top_k 0, top_p 1, seed 0,
 * no deadline, class "default", no tenant tag, no prompt, the stop token ends it. */
void ringlm_request_init(ringlm_request *req);

/* ---- sampling extensions (0.4) ---------------------------------------------------------
 * ringlm_request cannot grow (it has no size field and programs allocate it), so what 0.4
 * adds travels in a second struct that starts with its own size, passed beside the request
 * to ringlm_submit_ext. Every sampled token goes through one pipeline, in this order (as
 * vLLM's):
 *
 *   logit_bias → repetition_penalty → presence/frequency_penalty → constraint
 *   → temperature → top_k → top_p → min_p → sample
 *
 *   logit_bias          added to the model's logit of each named token (-100 forbids a token
 *                       in practice, +100 forces it);
 *   repetition_penalty  r (CTRL, vLLM): for every token that appears in the prompt or the
 *                       output so far, a logit l > 0 becomes l / r, l <= 0 becomes l * r;
 *   presence_penalty    p, frequency_penalty f (OpenAI): for every token generated c > 0
 *                       times so far, l -= p + c * f (output tokens only, not the prompt);
 *   min_p               after top-k/top-p: tokens whose probability is below min_p times the
 *                       most likely one's are dropped;
 *   constraint          structured output (see "constraints" below): every token the text so
 *                       far cannot continue with is dropped, and the stop token is allowed
 *                       only where the text is complete.
 *
 * Their cost per step is proportional to the distinct tokens seen, never the vocabulary.
 * With every field at its neutral value the answer is exactly ringlm_submit's. Greedy
 * requests (temperature 0) see bias and penalties too; min_p, top_k and top_p never change a
 * greedy pick.
 *
 * stop_token_ids end the request like the model's stop token: the token is not emitted and
 * the request finishes with RINGLM_FINISH_STOP. ringlm_request.ignore_stop ignores only the
 * model's stop tokens, never these (as vLLM's ignore_eos and stop_token_ids).
 *
 * Refused with -ENOTSUP and a detail (never accepted silently): n > 1 where the daemon runs
 * one sample (ringlm_max_samples), n > 1 with a constraint where it does not run constrained
 * samples (ringlm_samples_constrained), and a constraint kind the daemon does not enforce
 * (ringlm_constraint_kinds).
 *
 * Constraints. constraint_kind and constraint (constraint_bytes bytes, at most
 * RINGLM_MAX_CONSTRAINT_BYTES) make the daemon generate only text that the constraint
 * accepts, token by token (docs/constraints.md says exactly what each kind enforces):
 *   RINGLM_CONSTRAINT_JSON_SCHEMA  the text of a JSON Schema (draft 4 to 2020-12); the answer
 *                                  is one JSON value that validates against it;
 *   RINGLM_CONSTRAINT_JSON_OBJECT  any JSON object (no constraint bytes);
 *   RINGLM_CONSTRAINT_REGEX        a regular expression the whole answer matches;
 *   RINGLM_CONSTRAINT_CHOICE       alternatives separated by NUL bytes ("yes\0no"): the answer
 *                                  is exactly one of them;
 *   RINGLM_CONSTRAINT_GRAMMAR      a GBNF grammar in llama.cpp's format (rule `root`);
 *   RINGLM_CONSTRAINT_PYTHON_CALLS tool calls as a Python list of keyword calls,
 *                                  [get_time(tz="UTC")] (the pythonic tool-call syntax):
 *                                  the JSON {"tools": [{"name": N, "parameters": SCHEMA},
 *                                  ...], "max_calls": K} (K 0: any number, else at most K);
 *                                  each argument a Python literal (None/True/False for
 *                                  null/true/false) that validates against its parameter.
 * The stop token is allowed only where the text is complete, so an answer that finishes with
 * RINGLM_FINISH_STOP is complete; one cut by max_new_tokens (RINGLM_FINISH_LENGTH) may not be.
 * The daemon compiles each distinct constraint once (cached by content), off its loop: the
 * first request of a constraint waits for the compile, later ones do not. A constraint that
 * does not compile — not JSON, a keyword it cannot enforce exactly, a $ref cycle with no base
 * case, a regex that does not parse, too large — is rejected: FINISH with
 * RINGLM_FINISH_REJECTED, cause RINGLM_R_BAD_PARAMS, and ringlm_event_detail says why
 * ("constraint: keyword 'not' at /properties/a: not supported"). Requests whose stop token is
 * ignored (ignore_stop) keep generating stop tokens once the text is complete. */
typedef struct ringlm_logit_bias {
    int32_t token; /* [0, vocabulary size) */
    float bias;    /* [-100, 100], finite */
} ringlm_logit_bias;

#define RINGLM_MAX_LOGIT_BIAS       1024 /* entries per request; each token at most once */
#define RINGLM_MAX_STOP_TOKEN_IDS   64
#define RINGLM_MAX_LOGPROBS         20 /* top_logprobs, prompt_logprobs (OpenAI's limit) */
#define RINGLM_MAX_CONSTRAINT_BYTES (256u << 10)
#define RINGLM_MAX_N                                                                               \
    256 /* samples per request (n), whatever the daemon allows:
                                           ringlm_max_samples says what this one does */

/* ringlm_sampling.flags: log-probabilities (see "log-probabilities" below) */
#define RINGLM_SAMPLING_LOGPROBS                                                                   \
    1u /* per generated token: its log-probability and
                                                 the top_logprobs most likely alternatives */
#define RINGLM_SAMPLING_LOGPROBS_PROCESSED                                                         \
    2u /* ... of the processed distribution (after the
                                                 pipeline, temperature, top-k and top-p); with
                                                 RINGLM_SAMPLING_LOGPROBS only; default: the
                                                 model's raw log-softmax, as vLLM */
#define RINGLM_SAMPLING_PROMPT_LOGPROBS                                                            \
    4u /* per prompt token from the second: its
                                                 log-probability and prompt_logprobs
                                                 alternatives (RINGLM_EV_PROMPT_TOKEN events);
                                                 max_new_tokens may then be 0 (the prompt is
                                                 scored, nothing generated); such a request
                                                 does not use the prefix cache */

/* ringlm_sampling.constraint_kind (see "Constraints" above) */
enum ringlm_constraint_kind {
    RINGLM_CONSTRAINT_NONE = 0,
    RINGLM_CONSTRAINT_JSON_SCHEMA = 1,  /* constraint: a JSON schema's text */
    RINGLM_CONSTRAINT_JSON_OBJECT = 2,  /* any JSON object; no constraint bytes */
    RINGLM_CONSTRAINT_REGEX = 3,        /* constraint: the pattern */
    RINGLM_CONSTRAINT_GRAMMAR = 4,      /* constraint: a GBNF grammar */
    RINGLM_CONSTRAINT_CHOICE = 5,       /* constraint: NUL-separated alternatives */
    RINGLM_CONSTRAINT_PYTHON_CALLS = 6, /* constraint: {"tools": [...], "max_calls": K} */
};

/* The constraint kinds the daemon enforces: bit k set for kind k (1u << RINGLM_CONSTRAINT_*);
 * 0 when it enforces none (it is older than this library, or was started without a
 * tokenizer), -EINVAL (c NULL). ringlm_submit_ext refuses the others with -ENOTSUP. */
int ringlm_constraint_kinds(const ringlm_client *c);

typedef struct ringlm_sampling {
    uint32_t size;            /* sizeof(ringlm_sampling) as the program was compiled: set by
                                 ringlm_sampling_init. A library reads only what it knows; a
                                 larger size (a newer header) is accepted when the bytes it
                                 does not know are 0, else -ENOTSUP */
    uint32_t flags;           /* RINGLM_SAMPLING_* */
    float repetition_penalty; /* (0, 100], finite; 1 = off */
    float presence_penalty;   /* [-2, 2], finite; 0 = off */
    float frequency_penalty;  /* [-2, 2], finite; 0 = off */
    float min_p;              /* [0, 1], finite; 0 = off */
    const ringlm_logit_bias *logit_bias; /* n_logit_bias entries (NULL when 0) */
    uint32_t n_logit_bias;               /* <= RINGLM_MAX_LOGIT_BIAS */
    uint32_t n_stop_token_ids;           /* <= RINGLM_MAX_STOP_TOKEN_IDS */
    const int32_t *stop_token_ids;       /* token ids that end the request */
    uint32_t top_logprobs;               /* [0, 20]; only with RINGLM_SAMPLING_LOGPROBS */
    uint32_t prompt_logprobs;            /* [0, 20]; only with RINGLM_SAMPLING_PROMPT_LOGPROBS */
    uint32_t n;                          /* samples of the prompt; 0 and 1 mean one; at most
                                            ringlm_max_samples (see "n samples" below) */
    uint32_t constraint_kind;            /* enum ringlm_constraint_kind */
    const void *constraint;              /* constraint_bytes bytes */
    size_t constraint_bytes;             /* <= RINGLM_MAX_CONSTRAINT_BYTES */
} ringlm_sampling;

/* Fills the neutral values: size, repetition_penalty 1, n 1, everything else 0. */
void ringlm_sampling_init(ringlm_sampling *smp);

enum ringlm_event_kind {
    RINGLM_EV_TOKEN = 1,        /* token, index valid */
    RINGLM_EV_FINISH = 2,       /* finish_reason, reject_reason, n_tokens, n_cached_tokens,
	                         policy_hash valid */
    RINGLM_EV_PROMPT_TOKEN = 3, /* (0.4) token = a prompt token, index = its position in the
	                         prompt (1 .. n_prompt - 1), with its log-probabilities
	                         (ringlm_event_logprobs); only for a request that asked for
	                         prompt log-probabilities, all before its first TOKEN */
};

/* 48 bytes on every 64-bit target; n_cached_tokens (0.2) sits in what was padding before
 * policy_hash, so no field of 0.1 moved and a program built against 0.1 still works (it
 * never reads the new field).  libclient/client.c checks the layout at build time. */
typedef struct ringlm_event {
    int kind;                 /* enum ringlm_event_kind */
    uint64_t req_id;          /* as returned by ringlm_submit */
    int32_t token;            /* TOKEN: token id */
    uint32_t index;           /* TOKEN: 0-based position in the request's output */
    int finish_reason;        /* FINISH: RINGLM_FINISH_* */
    int reject_reason;        /* FINISH: RINGLM_R_* cause or 0 */
    uint32_t n_tokens;        /* FINISH: tokens generated for this request */
    uint32_t n_cached_tokens; /* FINISH: prompt tokens served from the daemon's prefix cache
	                           (whole KV blocks its first admission found, a multiple of the
	                           block size — but for a further sample of n > 1, which shares
	                           the prompt's partial last block too; 0 when none, when
	                           rejected before admission, with ringlmd --no-prefix-cache, or
	                           from a daemon older than 0.2) */
    uint64_t policy_hash;     /* FINISH: identity of the scheduling policy that served it */
} ringlm_event;

/*
 * Connects to ringlmd and maps the session's shared memory.
 * socket_path: NULL → $RINGLM_SOCKET → RINGLM_DEFAULT_SOCKET.
 * Returns 0 and *out, or:
 *   -ENOENT / -ECONNREFUSED  no daemon listens on that path
 *   -EACCES                  no permission on the socket
 *   -ENAMETOOLONG            path longer than a Unix socket path can be
 *   -EPROTO                  the daemon speaks another ABI / malformed handshake (detail)
 *   -EUSERS                  the daemon's session limit (total or per uid) is reached
 *   -EPERM                   the daemon refused this uid
 *   -ESHUTDOWN               the daemon is draining
 *   -ETIMEDOUT               no answer to the handshake within 5 s
 *   -EPIPE / -ECONNRESET     the daemon exited (a drain ending, a kill) during the handshake:
 *                            it closed the accepted connection before the hello was sent
 *                            (EPIPE) or before it answered (ECONNRESET)
 *   -ENOMEM, -EMFILE, other  local resources
 */
int ringlm_connect(const char *socket_path, ringlm_client **out);

/*
 * The one check of a request's parameters, as ringlm_submit runs it and the daemon runs it
 * again on every record it reads: NULL prompt with n_prompt > 0, n_prompt 0, a range of
 * ringlm_request above broken (max_new_tokens [1, 2^28 - 1], temperature [0, 100] and
 * finite, top_p (0, 1] and finite, deadline_us at most a year), a class or tenant name of 16
 * bytes or more.  Needs no connection: a front end (the gateway) answers its 400s from it.
 * Returns 0, or -EINVAL with a detail (ringlm_errdetail: "temperature 200 outside [0, 100]");
 * when field is not NULL, *field is the name of the ringlm_request member at fault
 * ("prompt", "n_prompt", "max_new_tokens", "temperature", "top_p", "deadline_us",
 * "class_name", "tenant_tag"), NULL when there is none.
 */
int ringlm_request_check(const ringlm_request *req, const char **field);

/*
 * Queues a request.  Never blocks.  *id receives the request id (unique in the session,
 * assigned by the library, >= 1; may be NULL).
 * Returns 0, or:
 *   -EINVAL     bad request, as ringlm_request_check says (the detail names the field and
 *               its range): the daemon never sees it, so no bad request is refused later
 *   -E2BIG      the record cannot fit the submit ring even when empty (prompt too long)
 *   -EAGAIN     the submit ring is full now; read events (the daemon consumes the ring
 *               continuously) and retry
 *   -ESHUTDOWN  the daemon is draining: no new requests
 *   -EPIPE / -ECONNRESET  the session is gone (see ringlm_next_event)
 */
int ringlm_submit(ringlm_client *c, const ringlm_request *req, uint64_t *id);

/*
 * Queues n requests together: the daemon reads all of them in one pass (they are published
 * with one store), so its scheduler sees them arrive at once — none can start, let alone
 * finish, before the last is there.  For work that belongs together: the n completions of
 * one chat request, a conversation's branches that share a prefix, a benchmark's burst.
 * All or nothing; never blocks.  ids[i] receives request i's id (ids may be NULL).
 * Returns 0, or (nothing queued):
 *   -EINVAL     n is 0, or a request is bad as for ringlm_submit (detail names its index)
 *   -E2BIG      the records cannot fit the submit ring together even when it is empty
 *   -EAGAIN     the submit ring has no room for all of them now; read events and retry
 *   -ENOMEM     no memory for the batch's records
 *   -ESHUTDOWN, -EPIPE, -ECONNRESET  as ringlm_submit
 */
int ringlm_submit_batch(ringlm_client *c, const ringlm_request *reqs, uint32_t n, uint64_t *ids);

/*
 * The one check of a request with its sampling extensions (smp may be NULL: the request
 * alone, as ringlm_request_check). vocab_size: the model's vocabulary (ringlm_vocab_size of
 * a client, the tokenizer's), or 0 to leave token ids unchecked against it (the daemon
 * checks them). The ranges are those of ringlm_sampling's comments; also refused: size
 * smaller than 0.4's struct (-EINVAL), bytes unknown to this library set (-ENOTSUP), a count
 * with a NULL list.
 * Returns 0, -EINVAL (out of range: the detail starts with the member, "logit_bias[2] token
 * 40000 outside the vocabulary of 32000") or -ENOTSUP (not implemented: "n 4 with prompt
 * log-probabilities is not implemented by this version"); *field (when not NULL) names the
 * member at fault, of ringlm_request (as ringlm_request_check) or of ringlm_sampling
 * ("logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_p",
 * "stop_token_ids", "top_logprobs", "prompt_logprobs", "n", "constraint", "flags", "size").
 */
int ringlm_request_check_ext(const ringlm_request *req, const ringlm_sampling *smp, int vocab_size,
                             const char **field);

/*
 * ringlm_submit with sampling extensions (smp NULL: exactly ringlm_submit). Checked as
 * ringlm_request_check_ext with the daemon's vocabulary. A neutral smp (as
 * ringlm_sampling_init leaves it) is sent as a plain request, so it works with any daemon;
 * any other needs a daemon of 0.4 or later: -ENOTSUP ("the daemon does not take sampling
 * extensions", or "the daemon does not send log-probabilities" for a request asking for
 * them) otherwise. Errors as ringlm_submit, plus -ENOTSUP.
 */
int ringlm_submit_ext(ringlm_client *c, const ringlm_request *req, const ringlm_sampling *smp,
                      uint64_t *id);
/* ringlm_submit_batch with smps[i] for reqs[i] (smps NULL: every request plain). */
int ringlm_submit_batch_ext(ringlm_client *c, const ringlm_request *reqs,
                            const ringlm_sampling *smps, uint32_t n, uint64_t *ids);

/* The model's vocabulary size as the daemon said at the handshake (token ids are
 * 0 .. size-1), or -ENOTSUP from a daemon older than 0.4. */
int ringlm_vocab_size(const ringlm_client *c);

/*
 * n samples of one prompt (ringlm_sampling.n > 1).
 *
 * Ids: the request takes n consecutive ids; *id (ids[i] for a batch) receives the first, and
 * sample i is id + i. Each sample is a request of its own to the client: its own TOKEN
 * events (index from 0), its own log-probabilities, its own FINISH (reason, cause,
 * n_tokens) — n FINISH events in all, whatever happens (a rejected request is rejected n
 * times, with one cause). A batch's next request starts after the n ids.
 * Seeds: sample i draws exactly as a single request with seed + i would (same prompt,
 * same parameters): the same tokens, given the same logits.
 * Sharing: the prompt is computed once. Sample 0 computes it; the others start from its
 * last row (each draws its first token there with its own seed, penalties and stop ids)
 * and share its KV blocks: the full ones through the prefix cache, the last partial one
 * copy-on-write (each further sample copies it at its first step instead of computing its
 * tokens again), so each further sample's FINISH says the whole prompt was cached
 * (n_cached_tokens = n_prompt). With --no-prefix-cache each sample computes the prompt
 * again, with the same answers.
 * Admission is all or nothing: the request is refused whole (n FINISH rejected) when the
 * n samples' KV blocks together could never fit (never_fits), or when the first sample is
 * refused; once admitted, no sample is refused. The group starts when the blocks to start
 * all n are free together (else it waits, together), and those are kept for the samples, so
 * no sample of a started group waits for blocks another request took.
 * Cancel: ringlm_cancel(id + i) cancels sample i. Until sample 0 has its first token the
 * samples wait on its prompt, so cancelling sample 0 then cancels them all.
 * Prompt log-probabilities (RINGLM_SAMPLING_PROMPT_LOGPROBS): computed once, by sample 0,
 * and given once, as the RINGLM_EV_PROMPT_TOKEN events of id (sample 0) — the same for every
 * sample. Such a request neither uses nor fills the prefix cache, so there each further
 * sample computes the prompt's KV again (the same answers).
 * Limits: n <= ringlm_max_samples(c) (the daemon's --max-n), else -EINVAL "n"; n > 1 with
 * max_new_tokens 0 is -EINVAL.
 * Constraints: with a constraint every sample has its own matcher (each answer follows the
 * constraint on its own, and the stop token ends a sample only where its own text is
 * complete); the constraint is compiled once for all n, and a constraint that does not
 * compile rejects all n with its detail.
 */
/* The most samples one request may ask for on this daemon (ringlmd --max-n); 1 from a
 * daemon that does not run n > 1 (then n > 1 is -ENOTSUP at submit). */
int ringlm_max_samples(const ringlm_client *c);
/* 1 when the daemon runs n > 1 samples of a request that carries a constraint (each sample
 * with its own matcher, as above), 0 when it does not (a daemon older than 0.5, or one that
 * runs no constraint or no n > 1: then such a request is -ENOTSUP at submit), -EINVAL (c
 * NULL). */
int ringlm_samples_constrained(const ringlm_client *c);

/*
 * Asks the daemon to cancel a request; its FINISH (CANCELLED, or whatever came first)
 * follows as an event.  Cancelling an unknown or finished id is harmless.
 * Returns 0, -EAGAIN (submit ring full), -EINVAL (id 0), -EPIPE / -ECONNRESET.
 */
int ringlm_cancel(ringlm_client *c, uint64_t req_id);

/*
 * Takes the next event.  Spins briefly (RINGLM_OPT_SPIN_US, default up to 50 µs), then
 * sleeps on the session's futex doorbell; the daemon wakes it when it publishes events
 * (once per batch at most).  The default spin adapts: waits longer than 50 µs (a stream
 * of one token per batch) halve it toward none, a shorter one restores it.
 * timeout_ms: < 0 wait for ever, 0 poll, > 0 at most that long.
 * Returns 1 and *ev, 0 when the timeout passed without an event, or:
 *   -EPIPE       the daemon went away (exited, killed) — after every event it published
 *   -ECONNRESET  the daemon ended this session (detail has its reason: "submit record
 *                length 7 is not a multiple of 8", "shutdown")
 *   -EPROTO      the event ring holds something this library cannot read
 *   -EINTR       a signal arrived while sleeping (only if the handler has no SA_RESTART
 *                semantics for futex; retry)
 * Never hangs when the daemon dies, and an idle client wakes for nothing else: each client
 * has a thread of its own blocked on the session's socket, which wakes a sleeping
 * ringlm_next_event when the daemon's end closes (Linux 5.16's futex_waitv; on an older
 * kernel, or in a child forked after the connect, the sleep wakes every 20 ms to look).
 */
int ringlm_next_event(ringlm_client *c, ringlm_event *ev, int timeout_ms);

/* (0.6) Makes a ringlm_next_event that sleeps on c in another thread return 0 (no event) now;
 * when none sleeps, the next one that would sleep returns 0 at once instead (events already
 * published are still returned first). For a thread that reads events without a timeout and
 * must also notice something else: a shutdown, work of its own to retry. Safe from any
 * thread and from a signal handler. Returns 0, -EINVAL (c NULL). */
int ringlm_wake(ringlm_client *c);

/* ---- log-probabilities (0.4) -------------------------------------------------------------
 * A request that asks (ringlm_sampling's RINGLM_SAMPLING_LOGPROBS: each generated token;
 * RINGLM_SAMPLING_PROMPT_LOGPROBS: each prompt token from the second, as RINGLM_EV_PROMPT_TOKEN
 * events) gets each such event's log-probabilities with it: read them right after
 * ringlm_next_event returned the event. Log-probabilities are natural logarithms of the
 * model's softmax over the whole vocabulary (the "raw" distribution, as vLLM's default), or
 * with RINGLM_SAMPLING_LOGPROBS_PROCESSED of the distribution the token was drawn from (after
 * the logits processors, temperature, top-k and top-p; excluded tokens are -inf and never
 * listed). Requests that do not ask cost nothing and carry none. */
typedef struct ringlm_logprobs {
    int32_t token;  /* the event's token */
    float logprob;  /* its log-probability (-inf when the processed distribution excludes it) */
    uint32_t rank;  /* 1 + the number of tokens more likely than it (vLLM's rank) */
    uint32_t n_top; /* entries below: the request's top_logprobs / prompt_logprobs, fewer
	                    only when fewer tokens have a finite log-probability */
    bool processed; /* from the processed distribution */
    int32_t top_token[RINGLM_MAX_LOGPROBS]; /* the most likely tokens, best first (ties: */
    float top_logprob[RINGLM_MAX_LOGPROBS]; /* the lower id first), and their logprobs */
} ringlm_logprobs;

/*
 * The log-probabilities that came with the event the last ringlm_next_event on c returned.
 * Call it from the thread that reads events, before the next ringlm_next_event.
 * Returns 1 and *out, 0 when that event carried none (it did not ask, or it is a FINISH),
 * -EINVAL (c or out NULL).
 */
int ringlm_event_logprobs(const ringlm_client *c, ringlm_logprobs *out);

/* (0.4) Why the request of the FINISH event the last ringlm_next_event on c returned ended as
 * it did, in words, when the daemon said (a constraint that does not compile: "constraint:
 * keyword 'not' at /properties/a: not supported"; a constraint that failed during
 * generation): a NUL-terminated string valid until the next ringlm_next_event, or NULL when
 * that event carried none. Details are sent for requests that carried a constraint. */
const char *ringlm_event_detail(const ringlm_client *c);

/* Options for ringlm_set_option. */
enum ringlm_option {
    RINGLM_OPT_SPIN_US = 1, /* how long next_event spins before sleeping (µs, >= 0);
	                           a huge value = always spin (lowest latency, burns a CPU).
	                           Set here or by $RINGLM_SPIN_US (read at connect), it is
	                           fixed; by default up to 50, adapted to the waits seen. */
};
/* Returns 0 or -EINVAL (unknown option or value). */
int ringlm_set_option(ringlm_client *c, int option, long value);

/* Session facts: the daemon's session id, the policy hash it currently serves. */
uint64_t ringlm_session_id(const ringlm_client *c);
uint64_t ringlm_policy_hash(const ringlm_client *c);
/* What the daemon said at the handshake about this session's place in its policy (fixed
 * for the session's life: a policy reloaded later is not reflected).
 *
 * ringlm_tenant_tags_honoured: 1 when the daemon honours ringlm_request.tenant_tag on this
 * session (this uid is in the policy's [trust]); 0 when it ignores them — every request is
 * then this uid's own tenant, whatever tag it carries (the built-in policy trusts no uid);
 * -ENOTSUP when the daemon does not say (one older than this library). A gateway that tags
 * requests per API key checks it at connect: ignored tags merge all its keys into one tenant
 * (one prefix-cache domain, one fair share).
 *
 * ringlm_policy_classes: the number of request classes the policy defines (at most
 * RINGLM_MAX_CLASSES), with names[i] set for i < max (names may be NULL to count); each
 * name is NUL-terminated and valid until ringlm_close. -ENOTSUP as above. A request naming
 * another class is rejected (RINGLM_R_UNKNOWN_CLASS). */
#define RINGLM_MAX_CLASSES 16
int ringlm_tenant_tags_honoured(const ringlm_client *c);
int ringlm_policy_classes(const ringlm_client *c, const char **names, int max);

/* 1 while the daemon drains (it takes no new requests; those in flight finish), else 0.
 * A gateway reads it for its health check, before any submit would fail with -ESHUTDOWN. */
int ringlm_draining(const ringlm_client *c);

/* The served model name the daemon said at the handshake (ringlmd --served-model-name, else
 * the GGUF's general.name, else the model file's base name): the model_name label of its
 * vllm:* metrics. Valid until ringlm_close; NULL when the daemon does not say (one older
 * than 0.5, or a service without a model). */
const char *ringlm_served_model(const ringlm_client *c);

/* The daemon's load, all its clients together, as its loop last published it (at the end
 * of every iteration where it changed): the figures of vllm:num_requests_waiting,
 * vllm:num_requests_running and vllm:kv_cache_usage_perc (kv_used_blocks / kv_total_blocks
 * of the device pool; blocks the prefix cache keeps that no sequence holds count free).
 * A read of the session's own mapping, no system call: cheap enough per request (a gateway
 * over several daemons weighs them with it). */
typedef struct ringlm_load {
    uint32_t waiting;         /* requests queued, not yet running */
    uint32_t running;         /* running, swapped out or in transit */
    uint32_t kv_used_blocks;  /* device KV blocks sequences hold */
    uint32_t kv_total_blocks; /* device KV blocks */
    uint64_t iterations;      /* the daemon's loop iterations when it was written */
} ringlm_load;
/* 0 and *out; -EINVAL (NULL), -ENOTSUP (a daemon that does not publish it: older than 0.5),
 * -EAGAIN (it changed under every one of many reads: never seen in practice). */
int ringlm_daemon_load(const ringlm_client *c, ringlm_load *out);

/* Closes the session (the daemon cancels everything still in flight) and frees c.
 * NULL is a no-op. */
void ringlm_close(ringlm_client *c);

/* Name of a (negative or positive) errno value, e.g. "EPIPE: broken pipe". */
const char *ringlm_strerror(int err);
/* Detail of the last failure in this thread ("" when none). */
const char *ringlm_errdetail(void);

/* ---- tokenizer -------------------------------------------------------------------------
 * Text to the token ids ringlmd expects, and ids back to text, exactly as ringlm's own tools
 * and gateway do it (one implementation, the daemon's). A tokenizer comes from the model's
 * files: a GGUF model file (its tokenizer.ggml.* vocabulary: SentencePiece, "llama", or
 * byte-level BPE, "gpt2", of Llama 3 or Qwen2/Qwen3) or a llama2.c tokenizer.bin.
 *
 *   ringlm_tokenizer *tok;
 *   ringlm_tokenizer_load("model.gguf", 0, &tok);
 *   int32_t *ids = malloc(ringlm_tokenize_bound(text) * sizeof *ids);
 *   int n = ringlm_tokenize(tok, text, RINGLM_TOKENIZE_SPECIAL, ids, ringlm_tokenize_bound(text));
 *   ... r.prompt = ids; r.n_prompt = n; ringlm_submit ...
 *   for each RINGLM_EV_TOKEN: ringlm_token_text(tok, prev, ev.token, &s); fputs(s); prev = ...
 *   ringlm_tokenizer_free(tok);
 *
 * Encoding: SentencePiece adds its dummy prefix (the text is encoded as if it began with a
 * space) and falls back to byte tokens; BPE splits the text with the vocabulary's
 * pre-tokenizer and encodes each invalid UTF-8 byte as U+FFFD. In a GGUF vocabulary the
 * special tokens (control, user-defined) are cut out of the text first, so a chat template's
 * markers ("<|im_start|>", "</s>") become their tokens. Time is O(n log n) in the text.
 *
 * THREAD-SAFETY: a loaded tokenizer is immutable; any number of threads may use it at once.
 * It is independent of any ringlm_client (no daemon is needed to tokenize).
 */
typedef struct ringlm_tokenizer ringlm_tokenizer; /* opaque */

/*
 * Loads a tokenizer. path: a GGUF file (recognised by its magic) or a llama2.c tokenizer
 * file. vocab_size: 0 = as many tokens as the file holds (a llama2.c file is read to its
 * end); > 0 = the model's vocabulary size, which the file must hold exactly (a llama2.c file
 * of another model is refused rather than misread).
 * Returns 0 and *out, or:
 *   -EINVAL      path or out NULL, vocab_size < 0, or the file is malformed or unsupported
 *                (detail names the token, key or field: "token 37: piece length 900 runs past
 *                the end of the file", "tokenizer.ggml.pre=\"x\": pre-tokenizer not supported")
 *   -ENOENT, -EACCES  the file cannot be opened (detail names it)
 *   -EIO         a read error
 *   -ENOMEM
 */
int ringlm_tokenizer_load(const char *path, int vocab_size, ringlm_tokenizer **out);

/* Frees a tokenizer (NULL is a no-op). Texts returned by ringlm_token_text die with it. */
void ringlm_tokenizer_free(ringlm_tokenizer *tok);

/* Number of tokens in the vocabulary (ids are 0 .. size-1), or -EINVAL when tok is NULL. */
int ringlm_tokenizer_vocab_size(const ringlm_tokenizer *tok);
/* Beginning-of-sequence, end-of-sequence and end-of-turn ids: -1 when the vocabulary names
 * none (llama2.c files: BOS 1, EOS 2, no EOT), -EINVAL when tok is NULL. A model that
 * samples its EOS (or, in chat, its EOT) has finished; llama2.c's run.c stops on BOS. */
int32_t ringlm_tokenizer_bos(const ringlm_tokenizer *tok);
int32_t ringlm_tokenizer_eos(const ringlm_tokenizer *tok);
int32_t ringlm_tokenizer_eot(const ringlm_tokenizer *tok);
/* The model's context length in tokens as the tokenizer's GGUF model file states it
 * (<general.architecture>.context_length): prompt plus generated tokens fit in it plus one.
 * 0 when the file states none (a llama2.c tokenizer.bin, a tokenizer-only GGUF); -EINVAL
 * when tok is NULL. */
int ringlm_tokenizer_context_length(const ringlm_tokenizer *tok);

/* Flags of ringlm_tokenize. */
#define RINGLM_TOKENIZE_BOS     1u /* start with the BOS id (when the vocabulary has one) */
#define RINGLM_TOKENIZE_EOS     2u /* end with the EOS id (when the vocabulary has one) */
/* BOS and EOS where the vocabulary's file asks for them, as llama.cpp's add_special adds
 * them: tokenizer.ggml.add_bos_token and add_eos_token; where a GGUF file says nothing, BOS
 * for SentencePiece and Llama 3's pre-tokenizer (when it names a BOS), EOS never; a llama2.c
 * tokenizer: BOS. With RINGLM_TOKENIZE_BOS or _EOS, that one is added either way. */
#define RINGLM_TOKENIZE_SPECIAL 4u

/* What RINGLM_TOKENIZE_SPECIAL adds on this tokenizer: RINGLM_TOKENIZE_BOS and/or _EOS (0:
 * neither), or -EINVAL when tok is NULL. */
int ringlm_tokenizer_add_special(const ringlm_tokenizer *tok);

/* Enough room for the ids of any encoding of text: 3 * strlen(text) + 3 (BOS, the dummy
 * prefix and EOS; an invalid byte can become the 3 bytes of U+FFFD in BPE). NULL gives 3. */
size_t ringlm_tokenize_bound(const char *text);

/*
 * Encodes the NUL-terminated UTF-8 text (any bytes are accepted) into ids[0 .. max_ids).
 * flags: RINGLM_TOKENIZE_BOS, RINGLM_TOKENIZE_EOS, RINGLM_TOKENIZE_SPECIAL, or 0.
 * Returns the number of ids written (0 for "" without flags), or:
 *   -EINVAL   tok or text NULL, ids NULL while max_ids > 0, unknown flags, or a byte that
 *             has no token (a SentencePiece vocabulary without byte fallback or unknown
 *             token: detail names the byte)
 *   -ENOSPC   the ids do not fit in max_ids (detail says how many they are); nothing useful
 *             is in ids. ringlm_tokenize_bound(text) is always enough.
 *   -E2BIG    the text is longer than 700 MB (the count would not fit an int)
 *   -ENOMEM
 */
int ringlm_tokenize(const ringlm_tokenizer *tok, const char *text, unsigned flags, int32_t *ids,
                    size_t max_ids);

/*
 * The text of token id when it follows token prev (prev < 0: none), as llama2.c's run.c
 * decodes a generation: after BOS the leading space of SentencePiece's dummy prefix is
 * dropped; a byte token ("<0x0A>") is its raw byte, whatever it is; control tokens of a GGUF
 * vocabulary give "". Byte-level BPE gives raw bytes too. So a character split over several
 * tokens is whole only once its last byte is out, and a printer that wants run.c's output
 * exactly drops a lone byte that is neither printable ASCII nor whitespace (the ringlm CLI
 * does).
 * *text: NUL-terminated, owned by the tokenizer (valid until ringlm_tokenizer_free).
 * Returns 0, or -EINVAL (tok or text NULL, id outside the vocabulary: detail names it).
 */
int ringlm_token_text(const ringlm_tokenizer *tok, int32_t prev, int32_t id, const char **text);

/*
 * The text of a whole sequence into buf (size bytes, NUL-terminated): each id's
 * ringlm_token_text after the id before it, the first as if it followed BOS (so
 * ringlm_tokenize's dummy prefix is dropped, with or without BOS in ids); BOS and EOS ids
 * themselves give nothing. For text that holds no special-token markers and, for
 * SentencePiece, does not start with a space (nor holds a NUL), the text ringlm_tokenize
 * encoded comes back byte for byte. size 0 only measures (buf may be NULL).
 * Returns the length of the text (without the NUL), or:
 *   -EINVAL   tok NULL, ids NULL while n > 0, buf NULL while size > 0, or an id outside the
 *             vocabulary (detail names its index and value)
 *   -ENOSPC   0 < size <= the length (detail says the size needed); buf holds the text cut
 *             to size - 1 bytes
 *   -E2BIG    the text would be longer than INT_MAX bytes
 */
int ringlm_detokenize(const ringlm_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                      size_t size);

/* ---- chat templates --------------------------------------------------------------------
 * A conversation to the prompt text a model of that family was trained on, ending where the
 * assistant's turn begins. A model file's own tokenizer.chat_template is rendered as Jinja
 * (ringlm_chat_jinja_*, below); these built-in formatters are for files without one, and can
 * be matched to a file's template by the markers it spells:
 *
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n   (Qwen)
 *   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] USER [/INST]
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ... assistant header
 *   mistral  [INST] SYSTEM\n\nUSER [/INST]ANSWER</s>[INST] USER [/INST]
 *   plain    the contents joined by "\n" (models that know no roles)
 *
 * Llama 3 trims each content and Llama 2 each turn, as their templates do. The text does not
 * start with the beginning-of-sequence token: the tokenizer adds it when the model's file
 * says so; markers between turns ("</s><s>", "<|eot_id|>") are text that the tokenizer of a
 * GGUF model maps to their special tokens. For conversations of system, user and assistant
 * messages ending on the user's, the token ids equal those of the model's own template
 * rendered by Jinja (Llama 3's, Qwen3's, Llama 2's and the five Mistral ones,
 * tests/test_gguf_vocab.c; where Mistral's first template refuses a system message, ringlm
 * writes it as "v1" does, before the first user message); Qwen3's reasoning
 * ("</think>" in an assistant message) and tool messages are not handled. */
typedef struct ringlm_chat_msg {
    const char *role; /* "system", "user", "assistant" (others are written as named) */
    const char *content;
} ringlm_chat_msg;

enum ringlm_chat_template {
    RINGLM_CHAT_PLAIN = 0,
    RINGLM_CHAT_CHATML = 1,
    RINGLM_CHAT_LLAMA2 = 2,
    RINGLM_CHAT_LLAMA3 = 3,
    RINGLM_CHAT_MISTRAL = 4,           /* Mistral 7B Instruct v0.1/v0.2's first template */
    RINGLM_CHAT_MISTRAL_V1 = 5,        /* Mistral's "v1" (" [INST] ", the system message first) */
    RINGLM_CHAT_MISTRAL_V3 = 6,        /* "v3" (Mistral 7B v0.3, Large 2407: "[INST] x[/INST]") */
    RINGLM_CHAT_MISTRAL_V3_TEKKEN = 7, /* "v3-tekken" (Mistral Nemo: "[INST]x[/INST]") */
    RINGLM_CHAT_MISTRAL_V7 = 8, /* "v7" (Mistral Large 2411: "[SYSTEM_PROMPT] x[/SYSTEM_PROMPT]") */
};

/* Template by name ("chatml", "llama2"/"llama-2", "llama3"/"llama-3", "mistral",
 * "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "plain"); -EINVAL when
 * unknown. */
int ringlm_chat_template_by_name(const char *name);
/* Its name ("?" when not a template); the names accepted ("chatml, llama2, ..."). */
const char *ringlm_chat_template_name(int tpl);
const char *ringlm_chat_template_names(void);
/* The built-in template a Jinja chat template is (by the markers it spells), or -ENOTSUP
 * when it is none of them (detail quotes its start). */
int ringlm_chat_template_match(const char *jinja);
/* The same for a GGUF model file's tokenizer.chat_template: -ENOENT when the file has none,
 * -ENOTSUP when it is not a built-in one, -EINVAL/-ENOENT/-EACCES when the file is unreadable
 * or not GGUF (detail says which). */
int ringlm_chat_template_of_model(const char *gguf_path);
/*
 * Renders n messages with template tpl into *text (NUL-terminated, malloc()ed: free() it).
 * Returns 0, -EINVAL (detail says why: no messages, a role the template cannot place —
 * llama2/mistral need user and assistant to alternate after an optional system message and
 * end on the user's), or -ENOMEM.
 */
int ringlm_chat_format(int tpl, const ringlm_chat_msg *msgs, int n, char **text);

/* ---- the model file's own chat template (Jinja) -----------------------------------------
 * A GGUF file's tokenizer.chat_template rendered as Hugging Face renders it (a small Jinja
 * interpreter, checked byte for byte against @huggingface/jinja on real models' templates:
 * tests/test_jinja.c), with everything a chat request carries: messages with any fields
 * (content as text or parts, tool_calls, tool_call_id, reasoning_content), tools,
 * add_generation_prompt and whatever else the template reads (enable_thinking, ...). The
 * built-in templates above are for files without one. Rendering is bounded in steps,
 * nesting, output and memory: a template that loops or grows fails instead of hanging.
 * A loaded template is read only: any number of threads may render it at once.
 *
 *   ringlm_chat_jinja *t;
 *   ringlm_chat_jinja_load("model.gguf", &t);
 *   ringlm_chat_jinja_render(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}",
 *                            ringlm_tokenizer_add_special(tok), &text);
 *   ... ringlm_tokenize(tok, text, RINGLM_TOKENIZE_SPECIAL, ...) ...
 *   free(text); ringlm_chat_jinja_free(t);
 */
typedef struct ringlm_chat_jinja ringlm_chat_jinja;

/* Flags of ringlm_chat_jinja_render: leave out a leading BOS token text, a trailing EOS token
 * text (a tokenizer that adds the id adds it). They are RINGLM_TOKENIZE_BOS and _EOS, so
 * ringlm_tokenizer_add_special(tok) gives llama.cpp's chat: the text stripped where the file's
 * vocabulary adds the ids, then ringlm_tokenize(..., RINGLM_TOKENIZE_SPECIAL, ...) (one BOS,
 * where the file asks for it). */
#define RINGLM_CHAT_JINJA_STRIP_BOS 1u
#define RINGLM_CHAT_JINJA_STRIP_EOS 2u

/* Loads gguf_path's tokenizer.chat_template and the texts of its BOS and EOS tokens (the
 * template's bos_token and eos_token). Returns 0; -ENOENT when the file has no template;
 * -EINVAL when the template does not parse (detail: the file and the template's line) or
 * the file is not GGUF; -EACCES; -E2BIG (the template nests too deep); -ENOMEM. */
int ringlm_chat_jinja_load(const char *gguf_path, ringlm_chat_jinja **out);
/* The same from a template's text (bos, eos: the token texts; NULL is ""). */
int ringlm_chat_jinja_new(const char *source, const char *bos, const char *eos,
                          ringlm_chat_jinja **out);
/*
 * Renders the template with the members of vars_json, a JSON object, as its variables
 * ({"messages": [...], "tools": [...], "add_generation_prompt": true, ...}); bos_token,
 * eos_token and add_generation_prompt (true) are added where it lacks them. *text is
 * NUL-terminated and malloc()ed (free() it). Returns 0; -EINVAL (vars_json is not a JSON
 * object, unknown flags, or the template failed: the detail says why — "chat template:
 * raise_exception: MESSAGE" when the template refuses the conversation itself); -E2BIG (the
 * template runs past its bounds: 5,000,000 steps, 400 levels of nesting, 16 MiB of text,
 * 128 MiB of memory); -ENOMEM.
 */
int ringlm_chat_jinja_render(const ringlm_chat_jinja *t, const char *vars_json, unsigned flags,
                             char **text);
void ringlm_chat_jinja_free(ringlm_chat_jinja *t);

/* The library's version, "MAJOR.MINOR.PATCH" (of the library loaded, which may differ from
 * the RINGLM_VERSION_* macros of the header a program was compiled with). If number is not
 * NULL it receives RINGLM_VERSION_NUMBER of the library. Never fails; static storage. */
const char *ringlm_version(int *number);

#ifdef __cplusplus
}
#endif
#endif
