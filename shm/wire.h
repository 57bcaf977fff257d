/* SPDX-License-Identifier: MIT */
/*
 * shm/wire.h — what crosses the trust boundary between a client and ringlmd: the
 * socket handshake messages, the layout of the two shared-memory segments of a
 * session, the request records of the submit ring, the 16-byte event slots, and
 * the reason codes.  libc only (DESIGN §1).
 *
 * Everything a client writes is untrusted.  The daemon reads it with the copy-once
 * helpers declared at the end of this file (shm/wire.c): copy a record into private
 * memory, then check it, then use only the copy.  A structural error (bad length,
 * unknown type or flag, index out of range) ends that session, never the daemon.
 *
 * Bump RINGLM_WIRE_ABI on any change to a struct or constant in this file.
 */
#ifndef RINGLM_SHM_WIRE_H
#define RINGLM_SHM_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/end_codes.h"

#define RINGLM_WIRE_MAGIC 0x524c4d31u /* "RLM1" */
#define RINGLM_WIRE_ABI   3u

/* ---- reason codes: one namespace, finish reasons < 16, causes >= 16 ----
 * The values, names and meanings are the one table's (common/end_codes.h). */
#define RINGLM_WIRE_R_ENUM(suffix, value, name, doc) RINGLM_WIRE_R_##suffix = (value),
enum ringlm_wire_reason {
    END_CODES(RINGLM_WIRE_R_ENUM) RINGLM_WIRE_R_MAX = END_CODES_MAX,
};
#undef RINGLM_WIRE_R_ENUM
/* Stable lower-case name ("queue_full"), "unknown" for codes not listed. */
const char *ringlm_wire_reason_name(unsigned code);

/* ---- event slots (daemon → client), 16 bytes, written once per iteration ---- */
enum ringlm_wire_event_kind {
    RINGLM_WIRE_EV_TOKEN = 1,      /* value = token id, meta index = position in output */
    RINGLM_WIRE_EV_FINISH = 2,     /* value = tokens generated; meta = reason<<8 | cause */
    RINGLM_WIRE_EV_FINISH_EXT = 3, /* always right after a FINISH, same publish:
	                                  req_id = policy hash, value = low 32 bits of req id,
	                                  meta index = cached prompt tokens (see below) */
    RINGLM_WIRE_EV_PROMPT = 4,     /* log-probabilities: see below */
    RINGLM_WIRE_EV_LOGPROB = 5,
    RINGLM_WIRE_EV_LOGPROB_TOP = 6,
    RINGLM_WIRE_EV_DETAIL = 7, /* a request's end explained in words: see below */
};
/* Log-probabilities (RINGLM_WIRE_CAP_LOGPROBS): extra slots written right after the event
 * they belong to and published with it (the daemon reserves a group's slots whole, so a
 * reader never sees half of one). The daemon writes them only for a request record that
 * asked (the sampling extension's LOGPROBS / PROMPT_LOGPROBS flags), so a library that
 * never asks never meets these kinds.
 *   PROMPT       a prompt token's log-probability follows: req_id, value = the prompt token,
 *                meta index = its position (1 .. n_prompt - 1); every PROMPT of a request
 *                comes before its first TOKEN
 *   LOGPROB      right after a TOKEN or PROMPT of the same request: req_id field = the float
 *                bits of the token's log-probability (low 32) and its rank (high 32: 1 + the
 *                tokens more likely); value = n_top (0..RINGLM_WIRE_TOP_LOGPROBS_MAX), the
 *                entries that follow; meta index = RINGLM_WIRE_LP_F_* flags
 *   LOGPROB_TOP  (n_top + 1) / 2 slots after a LOGPROB, two entries each, best first: req_id
 *                field = the float bits of entry 2j's log-probability (low 32) and entry
 *                2j+1's (high 32); value = entry 2j's token; meta index = entry 2j+1's token,
 *                RINGLM_WIRE_INDEX_MAX when there is none (n_top odd, last slot) */
#define RINGLM_WIRE_TOP_LOGPROBS_MAX  20
#define RINGLM_WIRE_LP_F_PROCESSED    1u /* from the processed distribution, not the raw one */
/* Slots a token with n_top alternatives takes: itself, its LOGPROB, the TOP pairs. */
#define RINGLM_WIRE_LP_SLOTS(n_top)   (2u + ((unsigned)(n_top) + 1u) / 2u)
/* Detail (RINGLM_WIRE_CAP_CONSTRAINT): slots right after a FINISH_EXT, in the same publish,
 * saying in words why the request ended as it did (a constraint that does not compile: "keyword
 * 'not' at /properties/a: not supported"). Written only for a request whose record carried a
 * constraint (which only a library that knows this kind sends), and only when there is a
 * detail. The first slot: req_id = the request id, value = the text's length in bytes (1 ..
 * RINGLM_WIRE_DETAIL_MAX), meta index = 0; then ceil(length / 12) slots of kind DETAIL with
 * meta index = 1, 2, ..., each carrying 12 bytes of text: 8 in the req_id field, 4 in value
 * (little-endian memory order; the last slot zero-padded). UTF-8, no NUL inside. */
#define RINGLM_WIRE_DETAIL_MAX        240u
#define RINGLM_WIRE_DETAIL_SLOTS(len) (1u + ((unsigned)(len) + 11u) / 12u)
/* FINISH_EXT's meta index: the prompt tokens the request's first admission found in the
 * prefix cache (full blocks, so a multiple of the block size; 0 when none, when the
 * request was rejected before admission, or when the cache is off), saturated at
 * RINGLM_WIRE_INDEX_MAX.  A daemon of ABI 3 from before this field wrote 0 there and a
 * library of that time ignores it, so either side may be older: the ABI stays 3. */
struct ringlm_wire_event {
    uint64_t req_id;
    int32_t value;
    uint32_t meta; /* kind in bits 28..31, index/reason in bits 0..27 */
};
_Static_assert(sizeof(struct ringlm_wire_event) == 16, "event slot is 16 bytes");

#define RINGLM_WIRE_EV_KIND(meta)      ((meta) >> 28)
#define RINGLM_WIRE_EV_LOW(meta)       ((meta)&0x0fffffffu)
#define RINGLM_WIRE_EV_META(kind, low) (((uint32_t)(kind) << 28) | ((uint32_t)(low)&0x0fffffffu))
#define RINGLM_WIRE_INDEX_MAX          0x0fffffffu

/* ---- submit records (client → daemon), length-prefixed, 8-byte aligned ---- */
enum ringlm_wire_rec_type {
    RINGLM_WIRE_REC_REQUEST = 1,
    RINGLM_WIRE_REC_CANCEL = 2,
    RINGLM_WIRE_REC_REQUEST_EXT = 3, /* a request with its sampling extensions: only to a
	                                    daemon whose dseg.caps has RINGLM_WIRE_CAP_SAMPLING */
};
struct ringlm_wire_rec_hdr {
    uint32_t len;   /* whole record in bytes, header included, multiple of 8 */
    uint16_t type;  /* enum ringlm_wire_rec_type */
    uint16_t flags; /* none defined: must be 0 */
};

#define RINGLM_WIRE_NAME_LEN     16 /* class name / tenant tag, NUL-terminated inside */
#define RINGLM_WIRE_REQ_F_TENANT 1u /* tenant_tag is meaningful */
#define RINGLM_WIRE_REQ_F_IGNORE_STOP                                                              \
    2u /* the stop token does not end the request: exactly
                                            max_new_tokens are generated (vLLM's ignore_eos) */
#define RINGLM_WIRE_REQ_F_KNOWN (RINGLM_WIRE_REQ_F_TENANT | RINGLM_WIRE_REQ_F_IGNORE_STOP)

struct ringlm_wire_request {
    uint64_t req_id;         /* client-chosen, unique per session, != 0 */
    uint64_t seed;           /* sampling seed */
    uint64_t deadline_us;    /* relative to submit_mono_us; 0 = none */
    uint64_t submit_mono_us; /* client's CLOCK_MONOTONIC at submit (untrusted hint) */
    uint32_t max_new_tokens; /* >= 1 */
    uint32_t n_prompt;       /* prompt token ids that follow the struct */
    float temperature;       /* 0 = greedy */
    float top_p;             /* (0, 1] */
    uint32_t top_k;          /* 0 = off */
    uint32_t flags;          /* RINGLM_WIRE_REQ_F_* */
    char class_name[RINGLM_WIRE_NAME_LEN];
    char tenant_tag[RINGLM_WIRE_NAME_LEN];
    /* int32_t prompt[n_prompt]; then zero padding to a multiple of 8 */
};
_Static_assert(sizeof(struct ringlm_wire_request) == 88, "request layout");

/* A REQUEST_EXT record: header | struct ringlm_wire_request | struct ringlm_wire_sampling |
 * int32_t prompt[n_prompt] | struct ringlm_wire_bias bias[n_logit_bias] |
 * int32_t stop_ids[n_stop_ids] | uint8_t constraint[constraint_bytes] | zero padding to a
 * multiple of 8.  Every list travels inside the record: the largest (the maxima below) is
 * far smaller than the default 1 MiB submit ring, and a record larger than a session's ring
 * is refused at submit (-E2BIG), as a long prompt is. */
#define RINGLM_WIRE_SMP_F_LOGPROBS           1u /* logprob + top_logprobs per output token */
#define RINGLM_WIRE_SMP_F_LOGPROBS_PROCESSED 2u /* ... of the processed distribution */
#define RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS    4u /* logprob + alternatives per prompt token */
#define RINGLM_WIRE_SMP_F_KNOWN                                                                    \
    (RINGLM_WIRE_SMP_F_LOGPROBS | RINGLM_WIRE_SMP_F_LOGPROBS_PROCESSED |                           \
     RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS)
#define RINGLM_WIRE_MAX_LOGIT_BIAS 1024u /* entries; a token at most once */
#define RINGLM_WIRE_MAX_STOP_IDS   64u
#define RINGLM_WIRE_MAX_LOGPROBS   20u /* OpenAI's top_logprobs limit */
#define RINGLM_WIRE_MAX_N                                                                          \
    256u /* samples per request (a daemon may allow
                                                   fewer: dseg.max_n) */
#define RINGLM_WIRE_MAX_CONSTRAINT_BYTES   (256u << 10)
/* ringlm_wire_sampling.constraint_kind (the values of ringlm.h's enum ringlm_constraint_kind) */
#define RINGLM_WIRE_CONSTRAINT_NONE        0u
#define RINGLM_WIRE_CONSTRAINT_JSON_SCHEMA 1u /* the schema's text (JSON) */
#define RINGLM_WIRE_CONSTRAINT_JSON_OBJECT 2u /* any JSON object; no bytes */
#define RINGLM_WIRE_CONSTRAINT_REGEX       3u /* the pattern, matched by the whole output */
#define RINGLM_WIRE_CONSTRAINT_GRAMMAR     4u /* a GBNF grammar */
#define RINGLM_WIRE_CONSTRAINT_CHOICE      5u /* alternatives separated by NUL bytes */
#define RINGLM_WIRE_CONSTRAINT_PYTHON_CALLS                                                        \
    6u /* {"tools": [{"name", "parameters"}], "max_calls"}: a Python list of keyword calls */
#define RINGLM_WIRE_CONSTRAINT_MAX_KIND 6u
#define RINGLM_WIRE_BIAS_MAX            100.0f /* |bias| */
#define RINGLM_WIRE_REP_PENALTY_MAX     100.0f /* repetition_penalty (0, 100] */
#define RINGLM_WIRE_PENALTY_MAX         2.0f   /* |presence|, |frequency| (OpenAI's range) */

struct ringlm_wire_sampling {
    uint32_t flags;           /* RINGLM_WIRE_SMP_F_* */
    float repetition_penalty; /* (0, 100], 1 = off */
    float presence_penalty;   /* [-2, 2], 0 = off */
    float frequency_penalty;  /* [-2, 2], 0 = off */
    float min_p;              /* [0, 1], 0 = off */
    uint32_t n_logit_bias;    /* <= RINGLM_WIRE_MAX_LOGIT_BIAS */
    uint32_t n_stop_ids;      /* <= RINGLM_WIRE_MAX_STOP_IDS */
    uint32_t top_logprobs;    /* [0, 20], only with F_LOGPROBS */
    uint32_t prompt_logprobs; /* [0, 20], only with F_PROMPT_LOGPROBS */
    uint32_t n;               /* samples of the prompt; 0 and 1 = one; at most
                                 RINGLM_WIRE_MAX_N and the daemon's dseg.max_n */
    uint32_t constraint_kind; /* 0 = none (the kinds: ringlm.h enum ringlm_constraint_kind) */
    uint32_t constraint_bytes;
    uint32_t reserved[4]; /* 0 */
};
_Static_assert(sizeof(struct ringlm_wire_sampling) == 64, "sampling layout");

struct ringlm_wire_bias {
    int32_t token;
    float bias;
};

struct ringlm_wire_cancel {
    uint64_t req_id;
};

/* Bytes of a request record with n prompt tokens (header + struct + prompt, padded). */
static inline uint64_t ringlm_wire_request_bytes(uint64_t n_prompt)
{
    uint64_t b = sizeof(struct ringlm_wire_rec_hdr) + sizeof(struct ringlm_wire_request) +
                 n_prompt * sizeof(int32_t);
    return (b + 7) & ~(uint64_t)7;
}
/* Bytes of a REQUEST_EXT record (see struct ringlm_wire_sampling). */
static inline uint64_t ringlm_wire_request_ext_bytes(uint64_t n_prompt, uint64_t n_bias,
                                                     uint64_t n_stop, uint64_t constraint_bytes)
{
    uint64_t b = sizeof(struct ringlm_wire_rec_hdr) + sizeof(struct ringlm_wire_request) +
                 sizeof(struct ringlm_wire_sampling) + n_prompt * sizeof(int32_t) +
                 n_bias * sizeof(struct ringlm_wire_bias) + n_stop * sizeof(int32_t) +
                 constraint_bytes;
    return (b + 7) & ~(uint64_t)7;
}
#define RINGLM_WIRE_CANCEL_BYTES                                                                   \
    (sizeof(struct ringlm_wire_rec_hdr) + sizeof(struct ringlm_wire_cancel))

/* ---- segment layout ----------------------------------------------------------------
 * Client segment (written by the client; the daemon maps it RW and trusts nothing in it):
 *   header | submit producer line | event-consumer line | doorbell line | submit ring data
 * Daemon segment (written by the daemon only; client maps it read-only; sealed against
 * writable mappings):
 *   header | event producer line | submit-consumer line | status | event ring slots
 * Free-running u64 indices; ring position = index & (capacity - 1).  Wrap-around is safe
 * because both sides compare distances (prod - cons, unsigned), never positions, and a
 * distance above the capacity is an error, never data.
 */
#define RINGLM_WIRE_LINE                                                                           \
    128 /* two cache lines, so the adjacent-line prefetcher does not
                                couple a producer field with a consumer field */

enum ringlm_wire_seg_kind { RINGLM_WIRE_SEG_CLIENT = 1, RINGLM_WIRE_SEG_DAEMON = 2 };

struct ringlm_wire_seg_header {
    uint32_t magic;        /* RINGLM_WIRE_MAGIC */
    uint32_t abi;          /* RINGLM_WIRE_ABI */
    uint32_t kind;         /* enum ringlm_wire_seg_kind */
    uint32_t header_bytes; /* offset of the first field line */
    uint64_t seg_bytes;    /* whole segment */
    uint64_t session_id;
    uint64_t data_off;   /* offset of the ring data (page aligned) */
    uint64_t data_bytes; /* submit ring bytes / event slots * 16 */
};

/* Client-written fields. */
struct ringlm_wire_cseg {
    struct ringlm_wire_seg_header hdr;
    uint8_t pad0[RINGLM_WIRE_LINE - sizeof(struct ringlm_wire_seg_header)];
    uint64_t submit_prod; /* bytes written into the submit ring (release) */
    uint8_t pad1[RINGLM_WIRE_LINE - 8];
    uint64_t ev_cons; /* event slots consumed (release); written per event */
    uint8_t pad2[RINGLM_WIRE_LINE - 8];
    /* Own line: the daemon reads it at every publish, and a line the client writes per
	 * event would bounce back to the client each time. */
    uint32_t client_sleeping; /* 1 while the client may be in futex wait on ev_prod */
    uint8_t pad2b[RINGLM_WIRE_LINE - 4];
    uint32_t doorbell; /* futex word: client bumps + wakes when daemon_sleeping */
    uint8_t pad3[RINGLM_WIRE_LINE - 4];
};

/* dseg.caps */
#define RINGLM_WIRE_CAP_FACTS 1u /* caps, n_classes and classes are filled in */
#define RINGLM_WIRE_CAP_TENANT_TAGS                                                                \
    2u /* this session's tenant tags are honoured (its uid is
                                          in the policy's [trust]); else they are ignored */
#define RINGLM_WIRE_CAP_SAMPLING                                                                   \
    4u /* the daemon reads REQUEST_EXT records; vocab_size
                                          is filled in */
#define RINGLM_WIRE_CAP_LOGPROBS                                                                   \
    8u /* the daemon sends log-probabilities (EV_PROMPT, EV_LOGPROB, EV_LOGPROB_TOP) to a
          request that asks for them */
#define RINGLM_WIRE_CAP_CONSTRAINT                                                                 \
    16u /* the daemon enforces the constraint of a REQUEST_EXT record for each kind in
           dseg.constraint_kinds, and explains a request's end (EV_DETAIL) to one that
           carried a constraint */
#define RINGLM_WIRE_CAP_MODEL 32u /* served_model is filled in */
#define RINGLM_WIRE_CAP_LOAD  64u /* load is kept current (struct ringlm_wire_load) */
#define RINGLM_WIRE_CAP_SAMPLES                                                                    \
    128u /* the daemon runs n > 1 samples of one prompt (ringlm_wire_sampling.n, up to
           dseg.max_n); the samples' ids are the record's req_id, req_id + 1, ... */
#define RINGLM_WIRE_CAP_SAMPLES_CONSTRAINED                                                        \
    256u /* with RINGLM_WIRE_CAP_SAMPLES and RINGLM_WIRE_CAP_CONSTRAINT: a request of n > 1
            samples may carry a constraint (each sample gets its own matcher); without it
            such a request is refused */
#define RINGLM_WIRE_CLASSES_MAX 16u
#define RINGLM_WIRE_MODEL_LEN   128u

/* The daemon's load, all its sessions together, rewritten by the loop thread at the end of
 * an iteration where it changed (a seqlock: seq is odd while the fields are being written;
 * a reader takes seq, the fields, seq again, and retries when it was odd or moved). One
 * copy per session, so a client reads its own read-only mapping and nothing crosses
 * sessions. The same figures as vllm:num_requests_waiting / _running and
 * vllm:kv_cache_usage_perc (kv_used / kv_total of the device pool). */
struct ringlm_wire_load {
    uint32_t seq;
    uint32_t waiting;  /* requests queued, not yet running */
    uint32_t running;  /* running, swapped out or in transit */
    uint32_t kv_used;  /* device KV blocks sequences hold (cached, unheld ones count free) */
    uint32_t kv_total; /* device KV blocks */
    uint32_t reserved;
    uint64_t iterations; /* the loop's iterations when written */
};

enum ringlm_wire_state {
    RINGLM_WIRE_ST_ALIVE = 1,
    RINGLM_WIRE_ST_DRAINING = 2, /* no new requests; running ones finish */
    RINGLM_WIRE_ST_CLOSED = 3,   /* session ended by the daemon; reason in status */
};

/* Daemon-written fields. */
struct ringlm_wire_dseg {
    struct ringlm_wire_seg_header hdr;
    uint8_t pad0[RINGLM_WIRE_LINE - sizeof(struct ringlm_wire_seg_header)];
    uint64_t ev_prod; /* event slots published (release); low 32 bits are the
	                              futex word the client sleeps on */
    uint8_t pad1[RINGLM_WIRE_LINE - 8];
    uint64_t submit_cons; /* submit-ring bytes consumed (release) */
    uint8_t pad2[RINGLM_WIRE_LINE - 8];
    /* Own line, read by the client after every submit (see ringlm_wire_cseg). */
    uint32_t daemon_sleeping; /* 1: client must ring the doorbell after publishing */
    uint32_t want_space;      /* 1: daemon waits for event-ring space (ring on ev_cons) */
    uint8_t pad2b[RINGLM_WIRE_LINE - 8];
    uint32_t state;       /* enum ringlm_wire_state */
    int32_t end_errno;    /* negative errno when CLOSED */
    uint64_t policy_hash; /* current policy identity */
    uint64_t session_id;
    char end_reason[104]; /* NUL-terminated text when CLOSED */
    /* What the daemon says of this session's place in its policy, written before the
     * welcome is sent and not changed after: whether its tenant tags are honoured, which
     * request classes exist. A daemon of ABI 3 from before these fields left them 0 (the
     * header area is zeroed) and a library of that time ignores them, so either side may
     * be older: the ABI stays 3, and caps without RINGLM_WIRE_CAP_FACTS means "not said". */
    uint32_t caps;      /* RINGLM_WIRE_CAP_* */
    uint32_t n_classes; /* names in classes[], at most RINGLM_WIRE_CLASSES_MAX */
    char classes[RINGLM_WIRE_CLASSES_MAX][RINGLM_WIRE_NAME_LEN]; /* NUL-terminated */
    /* With RINGLM_WIRE_CAP_SAMPLING (added the same way: an older daemon leaves it 0): the
     * model's vocabulary size, so the library checks token ids at submit. */
    uint32_t vocab_size;
    /* With RINGLM_WIRE_CAP_CONSTRAINT (an older daemon leaves it 0): bit k set when the
     * daemon enforces constraint kind k (RINGLM_WIRE_CONSTRAINT_*). */
    uint32_t constraint_kinds;
    /* With RINGLM_WIRE_CAP_MODEL (added the same way): the served model name, the one its
     * vllm:* metrics label model_name with (NUL-terminated). */
    char served_model[RINGLM_WIRE_MODEL_LEN];
    /* With RINGLM_WIRE_CAP_LOAD (the same way): on its own line, rewritten while the session
     * lives. */
    _Alignas(RINGLM_WIRE_LINE) struct ringlm_wire_load load;
    /* With RINGLM_WIRE_CAP_SAMPLES (added the same way): the most samples one request may
     * ask for (ringlmd --max-n), so the library refuses more at submit. */
    uint32_t max_n;
};

#define RINGLM_WIRE_HEADER_AREA 4096 /* ring data starts on the next page */
_Static_assert(sizeof(struct ringlm_wire_cseg) <= RINGLM_WIRE_HEADER_AREA, "cseg");
_Static_assert(sizeof(struct ringlm_wire_dseg) <= RINGLM_WIRE_HEADER_AREA, "dseg");

/* Limits the daemon accepts in the handshake / config. */
#define RINGLM_WIRE_SUBMIT_MIN  4096u
#define RINGLM_WIRE_SUBMIT_MAX  (64u << 20)
#define RINGLM_WIRE_EVSLOTS_MIN 64u
#define RINGLM_WIRE_EVSLOTS_MAX (1u << 22)

/* ---- socket handshake (SOCK_SEQPACKET) -------------------------------------------------
 * client → daemon: hello.  daemon → client: welcome, with SCM_RIGHTS fds
 * [client segment, daemon segment, (eventfd when doorbell_mode == EVENTFD)] when
 * status == 0; no fds and a negative errno + detail text otherwise.  After that the
 * client sends nothing; the socket is the liveness signal (EOF = peer gone). */
enum ringlm_wire_doorbell { RINGLM_WIRE_DB_FUTEX = 1, RINGLM_WIRE_DB_EVENTFD = 2 };

struct ringlm_wire_hello {
    uint32_t magic;
    uint32_t abi;
    uint32_t flags; /* none defined: 0 */
    uint32_t reserved;
};

struct ringlm_wire_welcome {
    uint32_t magic;
    uint32_t abi;           /* the daemon's ABI (also sent on failure) */
    int32_t status;         /* 0 or -errno (-EPROTO ABI mismatch, -EUSERS limits...) */
    uint32_t doorbell_mode; /* enum ringlm_wire_doorbell */
    uint64_t session_id;
    uint64_t cseg_bytes;
    uint64_t dseg_bytes;
    uint64_t policy_hash;
    char detail[160]; /* why, when status != 0 */
};

/* ---- copy-once record parsing (shm/wire.c) ------------------------------------------ */

/* A record after parsing: everything refers to the caller's private copy. */
struct ringlm_wire_parsed {
    uint16_t type;
    const struct ringlm_wire_request *req; /* REQUEST: the struct inside the copy */
    const int32_t *prompt;                 /* REQUEST: n = req->n_prompt */
    char class_name[RINGLM_WIRE_NAME_LEN]; /* NUL-terminated copies */
    char tenant_tag[RINGLM_WIRE_NAME_LEN]; /* "" unless REQ_F_TENANT */
    uint64_t cancel_id;                    /* CANCEL */
    /* REQUEST_EXT only (NULL for a plain REQUEST): the sampling extensions and their lists,
     * inside the copy (n_logit_bias, n_stop_ids, constraint_bytes in *smp). */
    const struct ringlm_wire_sampling *smp;
    const struct ringlm_wire_bias *bias;
    const int32_t *stop_ids;
    const uint8_t *constraint;
};

/*
 * Parses one record that lies entirely in private memory (rec, len bytes, 8-byte
 * aligned).  Structural checks only: length, type, flags, NUL-terminated names,
 * n_prompt consistent with len, req_id != 0.  Returns 0, or -EBADMSG with a detail
 * ("request record is 96 bytes, 3 prompt tokens need 104") in why.
 */
int ringlm_wire_parse(const void *rec, size_t len, struct ringlm_wire_parsed *out, char *why,
                      size_t why_len);

/*
 * The one check of a request's parameters, the only place their ranges live: the client
 * library runs it at submit (ringlm_submit and ringlm_request_check answer -EINVAL with its
 * detail, so a bad request is refused before it is sent), the daemon runs it again on every
 * record it reads (a client that writes the ring itself is rejected with bad_params), and the
 * gateway answers its 400s from it (through ringlm_request_check).  The ranges:
 *   n_prompt        >= 1
 *   max_new_tokens  [1, RINGLM_WIRE_INDEX_MAX]
 *   temperature     [0, RINGLM_WIRE_TEMPERATURE_MAX], finite (0 = greedy)
 *   top_p           (0, 1], finite (1 = off)
 *   deadline_us     [0, RINGLM_WIRE_DEADLINE_MAX_US] (0 = none; so now + deadline never
 *                   wraps)
 * Returns 0, or a reject cause (RINGLM_WIRE_R_BAD_PARAMS) with a detail that starts with the
 * field's name ("temperature 200 outside [0, 100]"); *field (when field is not NULL) is that
 * name, the member of both struct ringlm_wire_request and ringlm_request, else NULL.
 */
#define RINGLM_WIRE_TEMPERATURE_MAX 100.0f
#define RINGLM_WIRE_DEADLINE_MAX_US (365ull * 24 * 3600 * 1000000) /* one year */
int ringlm_wire_check_request_field(const struct ringlm_wire_request *req, const char **field,
                                    char *why, size_t why_len);
/* The same check when the field's name is not needed. */
int ringlm_wire_check_request(const struct ringlm_wire_request *req, char *why, size_t why_len);
/* The same check for a request with a sampling extension whose flags are smp_flags (0 for a
 * plain request): max_new_tokens 0 is in range when it asks for its prompt's
 * log-probabilities (RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS: lm-eval's echo scoring computes the
 * prompt and ends). The library and the daemon call this one. */
int ringlm_wire_check_request_smp(const struct ringlm_wire_request *req, uint32_t smp_flags,
                                  const char **field, char *why, size_t why_len);

/*
 * The one check of the sampling extensions (struct ringlm_wire_sampling and its lists), run
 * by the same three parties beside ringlm_wire_check_request_field.  vocab: the model's
 * vocabulary size, 0 when unknown (then ids are only checked >= 0; the daemon always knows).
 *   logit_bias          at most RINGLM_WIRE_MAX_LOGIT_BIAS, token in [0, vocab), each token
 *                       once, bias in [-100, 100] and finite
 *   repetition_penalty  (0, 100], finite (1 = off)
 *   presence_penalty, frequency_penalty  [-2, 2], finite (0 = off)
 *   min_p               [0, 1], finite (0 = off)
 *   stop_token_ids      at most RINGLM_WIRE_MAX_STOP_IDS, each in [0, vocab)
 *   top_logprobs, prompt_logprobs  [0, 20], and 0 unless their flag is set
 *   n                   [0, RINGLM_WIRE_MAX_N]; above 1 only with max_new_tokens >= 1
 *                       (the daemon's own maximum, dseg.max_n, is checked by who knows it)
 *   flags, reserved     known bits only; 0
 *   constraint          a kind in [0, RINGLM_WIRE_CONSTRAINT_MAX_KIND]; at most
 *                       RINGLM_WIRE_MAX_CONSTRAINT_BYTES; none for NONE and JSON_OBJECT, some
 *                       for the others (whether it compiles is the daemon's to say: it
 *                       rejects with bad_params and the compiler's detail)
 * and what is not implemented is refused here, never accepted silently (*unsupported =
 * true, so the library answers -ENOTSUP; no member is refused so today). Which constraint
 * kinds a daemon enforces is its own (dseg.constraint_kinds): the library refuses the others
 * -ENOTSUP.
 * Returns 0, or RINGLM_WIRE_R_BAD_PARAMS with a detail that starts with the member's name
 * ("logit_bias[3] token 40000 outside the vocabulary of 32000"); *field (when not NULL) is
 * that member of ringlm_sampling ("logit_bias", "repetition_penalty", "presence_penalty",
 * "frequency_penalty", "min_p", "stop_token_ids", "top_logprobs", "prompt_logprobs", "n",
 * "constraint", "flags").
 */
int ringlm_wire_check_sampling(const struct ringlm_wire_parsed *rec, uint32_t vocab,
                               const char **field, bool *unsupported, char *why, size_t why_len);

/* ---- detail slots (shm/wire.c) ------------------------------------------------------ */

/* Writes the DETAIL slots of text (cut at RINGLM_WIRE_DETAIL_MAX bytes) for req_id into out
 * (room for RINGLM_WIRE_DETAIL_SLOTS(RINGLM_WIRE_DETAIL_MAX)); returns how many (0 for an
 * empty text). */
unsigned ringlm_wire_detail_encode(uint64_t req_id, const char *text,
                                   struct ringlm_wire_event *out);
/* Reads a DETAIL group (head, then the text slots in[0 .. avail)) into text (room for
 * RINGLM_WIRE_DETAIL_MAX + 1, NUL-terminated): returns the text slots it used, or -EBADMSG
 * with a detail (a length out of range, too few slots, a slot of another kind or out of
 * order, a NUL inside). */
int ringlm_wire_detail_decode(const struct ringlm_wire_event *head,
                              const struct ringlm_wire_event *in, unsigned avail, char *text,
                              char *why, size_t why_len);

/* ---- log-probability slots (shm/wire.c): the one encoder and the one decoder ---------- */

/* One token's log-probabilities as they travel. */
struct ringlm_wire_logprobs {
    float logprob;
    uint32_t rank;
    uint32_t flags; /* RINGLM_WIRE_LP_F_* */
    uint32_t n_top; /* <= RINGLM_WIRE_TOP_LOGPROBS_MAX */
    int32_t top_token[RINGLM_WIRE_TOP_LOGPROBS_MAX];
    float top_logprob[RINGLM_WIRE_TOP_LOGPROBS_MAX];
};

/* Writes the LOGPROB slot and its LOGPROB_TOP slots into out (room for
 * RINGLM_WIRE_LP_SLOTS(n_top) - 1 slots); returns how many. n_top above the maximum is cut. */
unsigned ringlm_wire_lp_encode(const struct ringlm_wire_logprobs *lp,
                               struct ringlm_wire_event *out);

/* Reads a LOGPROB slot (head) and the TOP slots after it (top[0 .. avail)): returns the TOP
 * slots it used, or -EBADMSG with a detail (not a LOGPROB, n_top above the maximum, fewer
 * TOP slots than it says, a slot of another kind, a token below 0). */
int ringlm_wire_lp_decode(const struct ringlm_wire_event *head, const struct ringlm_wire_event *top,
                          unsigned avail, struct ringlm_wire_logprobs *out, char *why,
                          size_t why_len);

#endif
