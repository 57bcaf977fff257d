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
    case RINGLM_WIRE_REC_REQUEST: {
        if (body_len < sizeof(struct ringlm_wire_request))
            return fail(why, why_len, "request record of %zu bytes is shorter than %zu", len,
                        sizeof(h) + sizeof(struct ringlm_wire_request));
        /* rec is 8-byte aligned (caller's copy), so body is too. */
        const struct ringlm_wire_request *r = (const struct ringlm_wire_request *)body;
        uint64_t want = ringlm_wire_request_bytes(r->n_prompt);
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
        /* Padding after the prompt must be zero (see copy_name). */
        size_t used = sizeof(h) + sizeof(*r) + (size_t)r->n_prompt * 4;
        for (size_t i = used; i < len; i++)
            if (((const unsigned char *)rec)[i])
                return fail(why, why_len, "request %llu: nonzero padding byte at %zu",
                            (unsigned long long)r->req_id, i);
        out->req = r;
        out->prompt = (const int32_t *)(body + sizeof(*r));
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
