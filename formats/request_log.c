/* SPDX-License-Identifier: MIT */
/* formats/request_log.c — the request log's writer and reader (see request_log.h). */
#include "formats/request_log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int fmt_request_format(const fmt_request *r, char *buf, size_t cap)
{
    fmt_json j;
    fmt_json_init(&j, buf, cap);
    fmt_json_uint(&j, "req", r->req);
    fmt_json_int(&j, "arrival_us", r->arrival_us);
    fmt_json_str(&j, "tenant", r->tenant ? r->tenant : "");
    fmt_json_str(&j, "class", r->class_name ? r->class_name : "");
    fmt_json_int(&j, "prompt_tokens", r->prompt_tokens);
    fmt_json_int(&j, "max_tokens", r->max_tokens);
    fmt_json_int(&j, "output_tokens", r->output_tokens);
    fmt_json_int(&j, "deadline_us", r->deadline_us);
    fmt_json_int(&j, "cancel_us", r->cancel_us);
    fmt_json_int(&j, "first_token_us", r->first_token_us);
    fmt_json_int(&j, "finish_us", r->finish_us);
    fmt_json_str(&j, "finish_reason", r->finish_reason ? r->finish_reason : "error");
    fmt_json_str(&j, "reject_reason", r->reject_reason);
    if (r->cached_tokens != FMT_NULL) fmt_json_int(&j, "cached_tokens", r->cached_tokens);
    bool hashes = r->n_hash_ids && r->hash_ids, answer = r->n_answer_hash_ids && r->answer_hash_ids;
    if (hashes || answer) fmt_json_uint(&j, "hash_block_tokens", r->hash_block_tokens);
    if (hashes) {
        fmt_json_array(&j, "hash_ids");
        for (uint32_t i = 0; i < r->n_hash_ids; i++) fmt_json_uint(&j, NULL, r->hash_ids[i]);
        fmt_json_close(&j);
    }
    if (answer) {
        fmt_json_array(&j, "answer_hash_ids");
        for (uint32_t i = 0; i < r->n_answer_hash_ids; i++) fmt_json_uint(&j, NULL, r->answer_hash_ids[i]);
        fmt_json_close(&j);
    }
    return fmt_json_end(&j);
}

/* Times are µs; a quarter of INT64_MAX leaves room for sums and scaling downstream. */
#define TIME_MAX (INT64_MAX / 4)
#define TOKENS_MAX 0x7fffffff

int fmt_request_parse(const char *line, size_t len, fmt_request *out, fmt_request_text *text,
                      char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    memset(text, 0, sizeof *text);
    json_t *o = fmt_load_object(line, len, why, whylen);
    if (!o) return -EINVAL;
    int64_t req = 0;
    int bad = fmt_get_int(o, "req", FMT_REQUIRED, 0, INT64_MAX, &req, why, whylen) ||
              fmt_get_int(o, "arrival_us", FMT_REQUIRED, 0, TIME_MAX, &out->arrival_us, why, whylen) ||
              fmt_get_int(o, "prompt_tokens", FMT_REQUIRED, 0, TOKENS_MAX, &out->prompt_tokens, why, whylen) ||
              fmt_get_int(o, "max_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->max_tokens, why, whylen) ||
              fmt_get_int(o, "output_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->output_tokens, why, whylen) ||
              fmt_get_int(o, "deadline_us", FMT_NULLABLE, 0, TIME_MAX, &out->deadline_us, why, whylen) ||
              fmt_get_int(o, "cancel_us", FMT_NULLABLE, 0, TIME_MAX, &out->cancel_us, why, whylen) ||
              fmt_get_int(o, "first_token_us", FMT_NULLABLE, 0, TIME_MAX, &out->first_token_us, why, whylen) ||
              fmt_get_int(o, "finish_us", FMT_NULLABLE, 0, TIME_MAX, &out->finish_us, why, whylen) ||
              fmt_get_int(o, "cached_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->cached_tokens, why, whylen) ||
              fmt_get_str(o, "tenant", 0, text->tenant, sizeof text->tenant, why, whylen) ||
              fmt_get_str(o, "class", 0, text->class_name, sizeof text->class_name, why, whylen) ||
              fmt_get_str(o, "finish_reason", 0, text->finish_reason, sizeof text->finish_reason, why, whylen) ||
              fmt_get_str(o, "reject_reason", 0, text->reject_reason, sizeof text->reject_reason, why, whylen) ||
              fmt_get_u64_array(o, "hash_ids", text->hash_ids, FMT_HASH_IDS_MAX, &out->n_hash_ids, why, whylen) ||
              fmt_get_u64_array(o, "answer_hash_ids", text->answer_hash_ids, FMT_HASH_IDS_MAX,
                                &out->n_answer_hash_ids, why, whylen);
    int64_t hbt = 0;
    if (!bad && (out->n_hash_ids || out->n_answer_hash_ids))
        bad = fmt_get_int(o, "hash_block_tokens", FMT_REQUIRED, 1, TOKENS_MAX, &hbt, why, whylen);
    json_decref(o);
    if (bad) return -EINVAL;
    if (out->n_hash_ids) out->hash_ids = text->hash_ids;
    if (out->n_answer_hash_ids) out->answer_hash_ids = text->answer_hash_ids;
    if (out->n_hash_ids || out->n_answer_hash_ids) out->hash_block_tokens = (uint32_t)hbt;
    out->req = (uint64_t)req;
    if (out->output_tokens == FMT_NULL && out->max_tokens == FMT_NULL) {
        snprintf(why, whylen, "missing \"output_tokens\" (and no \"max_tokens\" either)");
        return -EINVAL;
    }
    if (out->output_tokens == FMT_NULL) out->output_tokens = out->max_tokens;
    if (out->max_tokens == FMT_NULL) out->max_tokens = out->output_tokens;
    out->tenant = text->tenant;
    out->class_name = text->class_name;
    out->finish_reason = text->finish_reason[0] ? text->finish_reason : NULL;
    out->reject_reason = text->reject_reason[0] ? text->reject_reason : NULL;
    return 0;
}
