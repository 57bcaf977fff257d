/* SPDX-License-Identifier: MIT */
/*
 * shm/wire.c — reason names and the copy-once record parser.  The parser only ever
 * reads the caller's private copy of a record; it never sees shared memory.
 */
#include "shm/wire.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ringlm_wire_reason_name(unsigned code)
{
    return end_code_name(code);
}

__attribute__((format(printf, 3, 4))) static int fail(char *why, size_t why_len, const char *fmt,
                                                      ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return -EBADMSG;
}

/* A fixed-size name field must hold a NUL; bytes after it must be 0 too, so that two
 * records meaning the same thing are the same bytes (and nothing hides behind the NUL). */
static int copy_name(char dst[RINGLM_WIRE_NAME_LEN], const char src[RINGLM_WIRE_NAME_LEN])
{
    size_t n = strnlen(src, RINGLM_WIRE_NAME_LEN);
    if (n == RINGLM_WIRE_NAME_LEN) return -1;
    for (size_t i = n; i < RINGLM_WIRE_NAME_LEN; i++)
        if (src[i]) return -1;
    memcpy(dst, src, RINGLM_WIRE_NAME_LEN);
    return 0;
}

int ringlm_wire_parse(const void *rec, size_t len, struct ringlm_wire_parsed *out, char *why,
                      size_t why_len)
{
    struct ringlm_wire_rec_hdr h;

    memset(out, 0, sizeof(*out));
    if (len < sizeof(h))
        return fail(why, why_len, "record of %zu bytes is shorter than its header", len);
    memcpy(&h, rec, sizeof(h));
    if (h.len != len)
        return fail(why, why_len, "record header says %u bytes, %zu were copied", h.len, len);
    if (len % 8) return fail(why, why_len, "record length %zu is not a multiple of 8", len);
    if (h.flags) return fail(why, why_len, "record flags 0x%x unknown", h.flags);
    out->type = h.type;
    const char *body = (const char *)rec + sizeof(h);
    size_t body_len = len - sizeof(h);

    switch (h.type) {
    case RINGLM_WIRE_REC_REQUEST:
    case RINGLM_WIRE_REC_REQUEST_EXT: {
        const bool ext = h.type == RINGLM_WIRE_REC_REQUEST_EXT;
        const size_t fixed =
            sizeof(struct ringlm_wire_request) + (ext ? sizeof(struct ringlm_wire_sampling) : 0);
        if (body_len < fixed)
            return fail(why, why_len, "request record of %zu bytes is shorter than %zu", len,
                        sizeof(h) + fixed);
        /* rec is 8-byte aligned (caller's copy), so body is too. */
        const struct ringlm_wire_request *r = (const struct ringlm_wire_request *)body;
        const struct ringlm_wire_sampling *sm =
            ext ? (const struct ringlm_wire_sampling *)(body + sizeof(*r)) : NULL;
        uint64_t want = ringlm_wire_request_bytes(r->n_prompt);
        if (sm) {
            if (sm->n_logit_bias > RINGLM_WIRE_MAX_LOGIT_BIAS)
                return fail(why, why_len, "request record: %u logit biases, at most %u",
                            sm->n_logit_bias, RINGLM_WIRE_MAX_LOGIT_BIAS);
            if (sm->n_stop_ids > RINGLM_WIRE_MAX_STOP_IDS)
                return fail(why, why_len, "request record: %u stop token ids, at most %u",
                            sm->n_stop_ids, RINGLM_WIRE_MAX_STOP_IDS);
            if (sm->constraint_bytes > RINGLM_WIRE_MAX_CONSTRAINT_BYTES)
                return fail(why, why_len, "request record: a constraint of %u bytes, at most %u",
                            sm->constraint_bytes, RINGLM_WIRE_MAX_CONSTRAINT_BYTES);
            for (int i = 0; i < 4; i++)
                if (sm->reserved[i])
                    return fail(why, why_len, "request record: reserved sampling word %d is not 0",
                                i);
            want = ringlm_wire_request_ext_bytes(r->n_prompt, sm->n_logit_bias, sm->n_stop_ids,
                                                 sm->constraint_bytes);
        }
        if (want != len)
            return fail(why, why_len, "request record is %zu bytes, %u prompt tokens need %llu",
                        len, r->n_prompt, (unsigned long long)want);
        if (r->req_id == 0) return fail(why, why_len, "request id 0 is reserved");
        if (r->flags & ~RINGLM_WIRE_REQ_F_KNOWN)
            return fail(why, why_len, "request flags 0x%x unknown", r->flags);
        if (copy_name(out->class_name, r->class_name))
            return fail(why, why_len, "request %llu: class_name not NUL-terminated/padded",
                        (unsigned long long)r->req_id);
        if (copy_name(out->tenant_tag, r->tenant_tag))
            return fail(why, why_len, "request %llu: tenant_tag not NUL-terminated/padded",
                        (unsigned long long)r->req_id);
        if (!(r->flags & RINGLM_WIRE_REQ_F_TENANT) && out->tenant_tag[0])
            return fail(why, why_len, "request %llu: tenant_tag set without its flag",
                        (unsigned long long)r->req_id);
        const char *lists = body + fixed;
        size_t used = sizeof(h) + fixed + (size_t)r->n_prompt * 4;
        if (sm) {
            out->smp = sm;
            /* The bias pairs follow the prompt: 4-byte aligned, as their members need. */
            out->bias = (const struct ringlm_wire_bias *)(lists + (size_t)r->n_prompt * 4);
            out->stop_ids = (const int32_t *)(out->bias + sm->n_logit_bias);
            out->constraint = (const uint8_t *)(out->stop_ids + sm->n_stop_ids);
            used += (size_t)sm->n_logit_bias * sizeof(struct ringlm_wire_bias) +
                    (size_t)sm->n_stop_ids * 4 + sm->constraint_bytes;
        }
        /* Padding after the lists must be zero (see copy_name). */
        for (size_t i = used; i < len; i++)
            if (((const unsigned char *)rec)[i])
                return fail(why, why_len, "request %llu: nonzero padding byte at %zu",
                            (unsigned long long)r->req_id, i);
        out->req = r;
        out->prompt = (const int32_t *)lists;
        return 0;
    }
    case RINGLM_WIRE_REC_CANCEL: {
        if (len != RINGLM_WIRE_CANCEL_BYTES)
            return fail(why, why_len, "cancel record is %zu bytes, must be %zu", len,
                        (size_t)RINGLM_WIRE_CANCEL_BYTES);
        struct ringlm_wire_cancel c;
        memcpy(&c, body, sizeof(c));
        if (c.req_id == 0) return fail(why, why_len, "cancel of request id 0");
        out->cancel_id = c.req_id;
        return 0;
    }
    default: return fail(why, why_len, "record type %u unknown", h.type);
    }
}

/* A parameter out of its range: the detail, the field's name, the cause. */
#define BAD_PARAM(name, ...)                                                                       \
    do {                                                                                           \
        if (field) *field = name;                                                                  \
        fail(why, why_len, name " " __VA_ARGS__);                                                  \
        return RINGLM_WIRE_R_BAD_PARAMS;                                                           \
    } while (0)

int ringlm_wire_check_request_field(const struct ringlm_wire_request *r, const char **field,
                                    char *why, size_t why_len)
{
    if (field) *field = NULL;
    if (r->n_prompt < 1) BAD_PARAM("n_prompt", "is 0: a request needs at least one prompt token");
    if (r->max_new_tokens < 1 || r->max_new_tokens > RINGLM_WIRE_INDEX_MAX)
        BAD_PARAM("max_new_tokens", "%u outside [1, %u]", r->max_new_tokens, RINGLM_WIRE_INDEX_MAX);
    if (!isfinite(r->temperature) || r->temperature < 0.0f ||
        r->temperature > RINGLM_WIRE_TEMPERATURE_MAX)
        BAD_PARAM("temperature", "%g outside [0, %g]", (double)r->temperature,
                  (double)RINGLM_WIRE_TEMPERATURE_MAX);
    if (!isfinite(r->top_p) || !(r->top_p > 0.0f) || r->top_p > 1.0f)
        BAD_PARAM("top_p", "%g outside (0, 1]", (double)r->top_p);
    if (r->deadline_us > RINGLM_WIRE_DEADLINE_MAX_US)
        BAD_PARAM("deadline_us", "%llu outside [0, %llu] (one year)",
                  (unsigned long long)r->deadline_us,
                  (unsigned long long)RINGLM_WIRE_DEADLINE_MAX_US);
    if (why && why_len) why[0] = 0;
    return 0;
}
#undef BAD_PARAM

int ringlm_wire_check_request(const struct ringlm_wire_request *r, char *why, size_t why_len)
{
    return ringlm_wire_check_request_field(r, NULL, why, why_len);
}

int ringlm_wire_check_request_smp(const struct ringlm_wire_request *r, uint32_t smp_flags,
                                  const char **field, char *why, size_t why_len)
{
    if (r->max_new_tokens == 0 && (smp_flags & RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS)) {
        struct ringlm_wire_request c = *r;
        c.max_new_tokens = 1; /* its prompt is all it computes: the other ranges as ever */
        return ringlm_wire_check_request_field(&c, field, why, why_len);
    }
    return ringlm_wire_check_request_field(r, field, why, why_len);
}

/* A sampling parameter out of its range (or not implemented: *unsupported). */
#define BAD_SMP(name, unsup, ...)                                                                  \
    do {                                                                                           \
        if (field) *field = name;                                                                  \
        if (unsupported) *unsupported = (unsup);                                                   \
        fail(why, why_len, __VA_ARGS__);                                                           \
        return RINGLM_WIRE_R_BAD_PARAMS;                                                           \
    } while (0)

static bool in_range(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ringlm_wire_check_sampling(const struct ringlm_wire_parsed *rec, uint32_t vocab,
                               const char **field, bool *unsupported, char *why, size_t why_len)
{
    if (field) *field = NULL;
    if (unsupported) *unsupported = false;
    if (why && why_len) why[0] = 0;
    const struct ringlm_wire_sampling *sm = rec->smp;
    if (!sm) return 0;
    if (sm->flags & ~RINGLM_WIRE_SMP_F_KNOWN)
        BAD_SMP("flags", false, "flags 0x%x: unknown bits 0x%x", sm->flags,
                sm->flags & ~RINGLM_WIRE_SMP_F_KNOWN);
    for (int i = 0; i < 4; i++)
        if (sm->reserved[i])
            BAD_SMP("flags", false, "reserved word %d is %u, must be 0", i, sm->reserved[i]);
    if (sm->n_logit_bias > RINGLM_WIRE_MAX_LOGIT_BIAS)
        BAD_SMP("logit_bias", false, "logit_bias holds %u entries, at most %u", sm->n_logit_bias,
                RINGLM_WIRE_MAX_LOGIT_BIAS);
    int32_t ids[RINGLM_WIRE_MAX_LOGIT_BIAS];
    for (uint32_t i = 0; i < sm->n_logit_bias; i++) {
        struct ringlm_wire_bias b = rec->bias[i];
        if (b.token < 0 || (vocab && (uint32_t)b.token >= vocab))
            BAD_SMP("logit_bias", false, "logit_bias[%u] token %d outside the vocabulary of %u", i,
                    b.token, vocab);
        if (!in_range(b.bias, -RINGLM_WIRE_BIAS_MAX, RINGLM_WIRE_BIAS_MAX))
            BAD_SMP("logit_bias", false, "logit_bias[%u] (token %d) value %g outside [-%g, %g]", i,
                    b.token, (double)b.bias, (double)RINGLM_WIRE_BIAS_MAX,
                    (double)RINGLM_WIRE_BIAS_MAX);
        ids[i] = b.token;
    }
    if (sm->n_logit_bias > 1) {
        qsort(ids, sm->n_logit_bias, sizeof ids[0], cmp_i32);
        for (uint32_t i = 1; i < sm->n_logit_bias; i++)
            if (ids[i] == ids[i - 1])
                BAD_SMP("logit_bias", false, "logit_bias names token %d twice", ids[i]);
    }
    if (!(sm->repetition_penalty > 0.0f) ||
        !in_range(sm->repetition_penalty, 0.0f, RINGLM_WIRE_REP_PENALTY_MAX))
        BAD_SMP("repetition_penalty", false, "repetition_penalty %g outside (0, %g]",
                (double)sm->repetition_penalty, (double)RINGLM_WIRE_REP_PENALTY_MAX);
    if (!in_range(sm->presence_penalty, -RINGLM_WIRE_PENALTY_MAX, RINGLM_WIRE_PENALTY_MAX))
        BAD_SMP("presence_penalty", false, "presence_penalty %g outside [-%g, %g]",
                (double)sm->presence_penalty, (double)RINGLM_WIRE_PENALTY_MAX,
                (double)RINGLM_WIRE_PENALTY_MAX);
    if (!in_range(sm->frequency_penalty, -RINGLM_WIRE_PENALTY_MAX, RINGLM_WIRE_PENALTY_MAX))
        BAD_SMP("frequency_penalty", false, "frequency_penalty %g outside [-%g, %g]",
                (double)sm->frequency_penalty, (double)RINGLM_WIRE_PENALTY_MAX,
                (double)RINGLM_WIRE_PENALTY_MAX);
    if (!in_range(sm->min_p, 0.0f, 1.0f))
        BAD_SMP("min_p", false, "min_p %g outside [0, 1]", (double)sm->min_p);
    if (sm->n_stop_ids > RINGLM_WIRE_MAX_STOP_IDS)
        BAD_SMP("stop_token_ids", false, "stop_token_ids holds %u ids, at most %u", sm->n_stop_ids,
                RINGLM_WIRE_MAX_STOP_IDS);
    for (uint32_t i = 0; i < sm->n_stop_ids; i++) {
        int32_t t = rec->stop_ids[i];
        if (t < 0 || (vocab && (uint32_t)t >= vocab))
            BAD_SMP("stop_token_ids", false,
                    "stop_token_ids[%u] token %d outside the vocabulary of %u", i, t, vocab);
    }
    if (sm->top_logprobs > RINGLM_WIRE_MAX_LOGPROBS)
        BAD_SMP("top_logprobs", false, "top_logprobs %u outside [0, %u]", sm->top_logprobs,
                RINGLM_WIRE_MAX_LOGPROBS);
    if (sm->top_logprobs && !(sm->flags & RINGLM_WIRE_SMP_F_LOGPROBS))
        BAD_SMP("top_logprobs", false, "top_logprobs %u without the logprobs flag",
                sm->top_logprobs);
    if (sm->prompt_logprobs > RINGLM_WIRE_MAX_LOGPROBS)
        BAD_SMP("prompt_logprobs", false, "prompt_logprobs %u outside [0, %u]", sm->prompt_logprobs,
                RINGLM_WIRE_MAX_LOGPROBS);
    if (sm->prompt_logprobs && !(sm->flags & RINGLM_WIRE_SMP_F_PROMPT_LOGPROBS))
        BAD_SMP("prompt_logprobs", false, "prompt_logprobs %u without the prompt-logprobs flag",
                sm->prompt_logprobs);
    if (sm->constraint_bytes > RINGLM_WIRE_MAX_CONSTRAINT_BYTES)
        BAD_SMP("constraint", false, "constraint of %u bytes, at most %u", sm->constraint_bytes,
                RINGLM_WIRE_MAX_CONSTRAINT_BYTES);
    if (sm->constraint_kind > RINGLM_WIRE_CONSTRAINT_MAX_KIND)
        BAD_SMP("constraint", false, "constraint kind %u unknown (at most %u)", sm->constraint_kind,
                RINGLM_WIRE_CONSTRAINT_MAX_KIND);
    if (sm->constraint_kind == 0 && sm->constraint_bytes)
        BAD_SMP("constraint", false, "constraint of %u bytes without a kind", sm->constraint_bytes);
    if (sm->constraint_kind == RINGLM_WIRE_CONSTRAINT_JSON_OBJECT && sm->constraint_bytes)
        BAD_SMP("constraint", false, "constraint json_object takes no bytes, got %u",
                sm->constraint_bytes);
    if (sm->constraint_kind && sm->constraint_kind != RINGLM_WIRE_CONSTRAINT_JSON_OBJECT &&
        !sm->constraint_bytes)
        BAD_SMP("constraint", false, "constraint kind %u without its text", sm->constraint_kind);
    if ((sm->flags & RINGLM_WIRE_SMP_F_LOGPROBS_PROCESSED) &&
        !(sm->flags & RINGLM_WIRE_SMP_F_LOGPROBS))
        BAD_SMP("flags", false, "flags 0x%x: processed log-probabilities without the logprobs flag",
                sm->flags);
    if (sm->n > RINGLM_WIRE_MAX_N)
        BAD_SMP("n", false, "n %u outside [1, %u]", sm->n, RINGLM_WIRE_MAX_N);
    if (sm->n > 1 && rec->req && rec->req->max_new_tokens == 0)
        BAD_SMP("n", false, "n %u with max_new_tokens 0: samples need a token to differ", sm->n);
    return 0;
}
#undef BAD_SMP

/* ---- detail slots -------------------------------------------------------------------- */

unsigned ringlm_wire_detail_encode(uint64_t req_id, const char *text, struct ringlm_wire_event *out)
{
    size_t len = text ? strlen(text) : 0;
    if (len > RINGLM_WIRE_DETAIL_MAX) len = RINGLM_WIRE_DETAIL_MAX;
    if (!len) return 0;
    out[0] = (struct ringlm_wire_event){.req_id = req_id,
                                        .value = (int32_t)len,
                                        .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_DETAIL, 0)};
    unsigned n = RINGLM_WIRE_DETAIL_SLOTS(len);
    for (unsigned k = 1; k < n; k++) {
        char chunk[12] = {0};
        size_t at = (size_t)(k - 1) * 12, take = len - at < 12 ? len - at : 12;
        memcpy(chunk, text + at, take);
        out[k].meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_DETAIL, k);
        memcpy(&out[k].req_id, chunk, 8);
        memcpy(&out[k].value, chunk + 8, 4);
    }
    return n;
}

int ringlm_wire_detail_decode(const struct ringlm_wire_event *head,
                              const struct ringlm_wire_event *in, unsigned avail, char *text,
                              char *why, size_t why_len)
{
    text[0] = 0;
    if (RINGLM_WIRE_EV_KIND(head->meta) != RINGLM_WIRE_EV_DETAIL ||
        RINGLM_WIRE_EV_LOW(head->meta) != 0 || head->value < 1 ||
        (uint32_t)head->value > RINGLM_WIRE_DETAIL_MAX) {
        snprintf(why, why_len, "detail of request %llu: bad head (length %d)",
                 (unsigned long long)head->req_id, head->value);
        return -EBADMSG;
    }
    size_t len = (size_t)head->value;
    unsigned n = RINGLM_WIRE_DETAIL_SLOTS(len) - 1;
    if (n > avail) {
        snprintf(why, why_len, "detail of request %llu: %u of its %u slots published",
                 (unsigned long long)head->req_id, avail, n);
        return -EBADMSG;
    }
    for (unsigned k = 0; k < n; k++) {
        if (RINGLM_WIRE_EV_KIND(in[k].meta) != RINGLM_WIRE_EV_DETAIL ||
            RINGLM_WIRE_EV_LOW(in[k].meta) != k + 1) {
            snprintf(why, why_len, "detail of request %llu: slot %u is not its text",
                     (unsigned long long)head->req_id, k + 1);
            return -EBADMSG;
        }
        char chunk[12];
        memcpy(chunk, &in[k].req_id, 8);
        memcpy(chunk + 8, &in[k].value, 4);
        size_t at = (size_t)k * 12, take = len - at < 12 ? len - at : 12;
        memcpy(text + at, chunk, take);
    }
    text[len] = 0;
    if (strlen(text) != len) {
        snprintf(why, why_len, "detail of request %llu: a NUL inside its text",
                 (unsigned long long)head->req_id);
        text[0] = 0;
        return -EBADMSG;
    }
    return (int)n;
}

/* ---- log-probability slots ----------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

unsigned ringlm_wire_lp_encode(const struct ringlm_wire_logprobs *lp, struct ringlm_wire_event *out)
{
    unsigned n =
        lp->n_top < RINGLM_WIRE_TOP_LOGPROBS_MAX ? lp->n_top : RINGLM_WIRE_TOP_LOGPROBS_MAX;
    out[0] = (struct ringlm_wire_event){
        .req_id = (uint64_t)f32_bits(lp->logprob) | (uint64_t)lp->rank << 32,
        .value = (int32_t)n,
        .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_LOGPROB, lp->flags),
    };
    unsigned k = 1;
    for (unsigned j = 0; j < n; j += 2, k++) {
        bool two = j + 1 < n;
        out[k] = (struct ringlm_wire_event){
            .req_id = (uint64_t)f32_bits(lp->top_logprob[j]) |
                      (two ? (uint64_t)f32_bits(lp->top_logprob[j + 1]) << 32 : 0),
            .value = lp->top_token[j],
            .meta =
                RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_LOGPROB_TOP,
                                    two ? (uint32_t)lp->top_token[j + 1] : RINGLM_WIRE_INDEX_MAX),
        };
    }
    return k;
}

int ringlm_wire_lp_decode(const struct ringlm_wire_event *head, const struct ringlm_wire_event *top,
                          unsigned avail, struct ringlm_wire_logprobs *out, char *why,
                          size_t why_len)
{
    if (RINGLM_WIRE_EV_KIND(head->meta) != RINGLM_WIRE_EV_LOGPROB) {
        snprintf(why, why_len, "event kind %u where a LOGPROB belongs",
                 RINGLM_WIRE_EV_KIND(head->meta));
        return -EBADMSG;
    }
    if (head->value < 0 || head->value > RINGLM_WIRE_TOP_LOGPROBS_MAX) {
        snprintf(why, why_len, "LOGPROB with %d alternatives (at most %d)", head->value,
                 RINGLM_WIRE_TOP_LOGPROBS_MAX);
        return -EBADMSG;
    }
    unsigned n = (unsigned)head->value, slots = (n + 1) / 2;
    if (slots > avail) {
        snprintf(why, why_len, "LOGPROB with %u alternatives followed by %u slots", n, avail);
        return -EBADMSG;
    }
    out->logprob = bits_f32((uint32_t)head->req_id);
    out->rank = (uint32_t)(head->req_id >> 32);
    out->flags = RINGLM_WIRE_EV_LOW(head->meta);
    out->n_top = n;
    for (unsigned k = 0; k < slots; k++) {
        const struct ringlm_wire_event *t = &top[k];
        unsigned j = 2 * k;
        uint32_t second = RINGLM_WIRE_EV_LOW(t->meta);
        if (RINGLM_WIRE_EV_KIND(t->meta) != RINGLM_WIRE_EV_LOGPROB_TOP || t->value < 0 ||
            (j + 1 < n && second == RINGLM_WIRE_INDEX_MAX)) {
            snprintf(why, why_len, "LOGPROB_TOP slot %u of %u is malformed", k, slots);
            return -EBADMSG;
        }
        out->top_token[j] = t->value;
        out->top_logprob[j] = bits_f32((uint32_t)t->req_id);
        if (j + 1 < n) {
            out->top_token[j + 1] = (int32_t)second;
            out->top_logprob[j + 1] = bits_f32((uint32_t)(t->req_id >> 32));
        }
    }
    return (int)slots;
}
