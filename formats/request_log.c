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
    if (r->sample_of) fmt_json_uint(&j, "sample_of", r->sample_of);
    if (r->logprobs) fmt_json_uint(&j, "logprobs", r->top_logprobs);
    if (r->processors) fmt_json_bool(&j, "processors", true);
    bool hashes = r->n_hash_ids && r->hash_ids, answer = r->n_answer_hash_ids && r->answer_hash_ids;
    if (hashes || answer) fmt_json_uint(&j, "hash_block_tokens", r->hash_block_tokens);
    if (hashes) {
        fmt_json_array(&j, "hash_ids");
        for (uint32_t i = 0; i < r->n_hash_ids; i++) fmt_json_uint(&j, NULL, r->hash_ids[i]);
        fmt_json_close(&j);
    }
    if (answer) {
        fmt_json_array(&j, "answer_hash_ids");
        for (uint32_t i = 0; i < r->n_answer_hash_ids; i++)
            fmt_json_uint(&j, NULL, r->answer_hash_ids[i]);
        fmt_json_close(&j);
    }
    if (r->sched_cost) {
        const fmt_sched_cost *c = r->sched_cost;
        fmt_json_object(&j, "sched_cost");
        fmt_json_int(&j, "at_us", c->at_us);
        fmt_json_double(&j, "correction", c->correction, -1);
        fmt_json_object(&j, "step");
        fmt_json_double(&j, "base_us", c->base_us, -1);
        fmt_json_double(&j, "prefill_token_us", c->prefill_token_us, -1);
        fmt_json_double(&j, "decode_seq_us", c->decode_seq_us, -1);
        fmt_json_double(&j, "context_token_us", c->context_token_us, -1);
        fmt_json_double(&j, "prefill_pair_us", c->prefill_pair_us, -1);
        fmt_json_close(&j);
        const fmt_tier_cost *tier[2] = {&c->host, &c->disk};
        for (int i = 0; i < 2; i++) {
            const fmt_tier_cost *t = tier[i];
            if (!t->out_bytes_per_s && !t->in_bytes_per_s && !t->latency_us) continue;
            fmt_json_object(&j, i ? "disk" : "host");
            fmt_json_double(&j, "out_bytes_per_s", t->out_bytes_per_s, -1);
            fmt_json_double(&j, "in_bytes_per_s", t->in_bytes_per_s, -1);
            fmt_json_double(&j, "latency_us", t->latency_us, -1);
            fmt_json_bool(&j, "out_measured", t->out_measured);
            fmt_json_bool(&j, "in_measured", t->in_measured);
            fmt_json_close(&j);
        }
        fmt_json_close(&j);
    }
    return fmt_json_end(&j);
}

/* "sched_cost" (see the header): 0 with *c filled and *present set, 0 when absent or null,
 * -1 with why. */
static int get_sched_cost(json_t *o, fmt_sched_cost *c, bool *present, char *why, size_t whylen)
{
    json_t *v = json_object_get(o, "sched_cost");
    *present = false;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) {
        snprintf(why, whylen, "\"sched_cost\" is not an object");
        return -1;
    }
    json_t *step = json_object_get(v, "step");
    if (!json_is_object(step)) {
        snprintf(why, whylen, "\"sched_cost\": \"step\" is missing or not an object");
        return -1;
    }
    if (fmt_get_int(v, "at_us", FMT_REQUIRED, 0, INT64_MAX / 4, &c->at_us, why, whylen) ||
        fmt_get_num(v, "correction", FMT_REQUIRED, 0, &c->correction, why, whylen) ||
        fmt_get_num(step, "base_us", FMT_REQUIRED, 0, &c->base_us, why, whylen) ||
        fmt_get_num(step, "prefill_token_us", FMT_REQUIRED, 0, &c->prefill_token_us, why, whylen) ||
        fmt_get_num(step, "decode_seq_us", FMT_REQUIRED, 0, &c->decode_seq_us, why, whylen) ||
        fmt_get_num(step, "context_token_us", FMT_REQUIRED, 0, &c->context_token_us, why, whylen) ||
        fmt_get_num(step, "prefill_pair_us", FMT_REQUIRED, 0, &c->prefill_pair_us, why, whylen))
        return -1;
    if (!(c->correction > 0) || !(c->prefill_token_us > 0)) {
        snprintf(why, whylen, "\"sched_cost\": \"%s\" must be > 0",
                 c->correction > 0 ? "prefill_token_us" : "correction");
        return -1;
    }
    const char *name[2] = {"host", "disk"};
    fmt_tier_cost *tier[2] = {&c->host, &c->disk};
    for (int i = 0; i < 2; i++) {
        json_t *t = json_object_get(v, name[i]);
        if (!t || json_is_null(t)) continue;
        if (!json_is_object(t)) {
            snprintf(why, whylen, "\"sched_cost\": \"%s\" is not an object", name[i]);
            return -1;
        }
        if (fmt_get_num(t, "out_bytes_per_s", FMT_REQUIRED, 0, &tier[i]->out_bytes_per_s, why,
                        whylen) ||
            fmt_get_num(t, "in_bytes_per_s", FMT_REQUIRED, 0, &tier[i]->in_bytes_per_s, why,
                        whylen) ||
            fmt_get_num(t, "latency_us", FMT_REQUIRED, 0, &tier[i]->latency_us, why, whylen))
            return -1;
        json_t *mo = json_object_get(t, "out_measured"), *mi = json_object_get(t, "in_measured");
        if ((mo && !json_is_boolean(mo) && !json_is_null(mo)) ||
            (mi && !json_is_boolean(mi) && !json_is_null(mi))) {
            snprintf(
                why, whylen,
                "\"sched_cost\": the %s tier's \"out_measured\" / \"in_measured\" are not booleans",
                name[i]);
            return -1;
        }
        tier[i]->out_measured = json_is_true(mo);
        tier[i]->in_measured = json_is_true(mi);
        if (!(tier[i]->out_bytes_per_s > 0) || !(tier[i]->in_bytes_per_s > 0)) {
            snprintf(why, whylen, "\"sched_cost\": the %s tier's bandwidths must be > 0", name[i]);
            return -1;
        }
    }
    *present = true;
    return 0;
}

/* Times are µs; a quarter of INT64_MAX leaves room for sums and scaling downstream. */
#define TIME_MAX   (INT64_MAX / 4)
#define TOKENS_MAX 0x7fffffff

int fmt_request_parse(const char *line, size_t len, fmt_request *out, fmt_request_text *text,
                      char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    memset(text, 0, sizeof *text);
    json_t *o = fmt_load_object(line, len, why, whylen);
    if (!o) return -EINVAL;
    int64_t req = 0;
    int bad =
        fmt_get_int(o, "req", FMT_REQUIRED, 0, INT64_MAX, &req, why, whylen) ||
        fmt_get_int(o, "arrival_us", FMT_REQUIRED, 0, TIME_MAX, &out->arrival_us, why, whylen) ||
        fmt_get_int(o, "prompt_tokens", FMT_REQUIRED, 0, TOKENS_MAX, &out->prompt_tokens, why,
                    whylen) ||
        fmt_get_int(o, "max_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->max_tokens, why, whylen) ||
        fmt_get_int(o, "output_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->output_tokens, why,
                    whylen) ||
        fmt_get_int(o, "deadline_us", FMT_NULLABLE, 0, TIME_MAX, &out->deadline_us, why, whylen) ||
        fmt_get_int(o, "cancel_us", FMT_NULLABLE, 0, TIME_MAX, &out->cancel_us, why, whylen) ||
        fmt_get_int(o, "first_token_us", FMT_NULLABLE, 0, TIME_MAX, &out->first_token_us, why,
                    whylen) ||
        fmt_get_int(o, "finish_us", FMT_NULLABLE, 0, TIME_MAX, &out->finish_us, why, whylen) ||
        fmt_get_int(o, "cached_tokens", FMT_NULLABLE, 0, TOKENS_MAX, &out->cached_tokens, why,
                    whylen) ||
        fmt_get_str(o, "tenant", 0, text->tenant, sizeof text->tenant, why, whylen) ||
        fmt_get_str(o, "class", 0, text->class_name, sizeof text->class_name, why, whylen) ||
        fmt_get_str(o, "finish_reason", 0, text->finish_reason, sizeof text->finish_reason, why,
                    whylen) ||
        fmt_get_str(o, "reject_reason", 0, text->reject_reason, sizeof text->reject_reason, why,
                    whylen) ||
        fmt_get_u64_array(o, "hash_ids", text->hash_ids, FMT_HASH_IDS_MAX, &out->n_hash_ids, why,
                          whylen) ||
        fmt_get_u64_array(o, "answer_hash_ids", text->answer_hash_ids, FMT_HASH_IDS_MAX,
                          &out->n_answer_hash_ids, why, whylen);
    int64_t sample_of = 0, top_lp = FMT_NULL;
    if (!bad)
        bad = fmt_get_int(o, "sample_of", 0, 1, INT64_MAX, &sample_of, why, whylen) ||
              fmt_get_int(o, "logprobs", FMT_NULLABLE, 0, 20, &top_lp, why, whylen);
    json_t *pr = json_object_get(o, "processors");
    if (!bad && pr && !json_is_null(pr) && !json_is_boolean(pr)) {
        snprintf(why, whylen, "\"processors\" must be a boolean");
        bad = 1;
    }
    out->sample_of = (uint64_t)sample_of;
    out->logprobs = top_lp != FMT_NULL;
    out->top_logprobs = top_lp != FMT_NULL ? (uint32_t)top_lp : 0;
    out->processors = pr && json_is_true(pr);
    bool cost = false;
    if (!bad) bad = get_sched_cost(o, &text->sched_cost, &cost, why, whylen);
    int64_t hbt = 0;
    if (!bad && (out->n_hash_ids || out->n_answer_hash_ids))
        bad = fmt_get_int(o, "hash_block_tokens", FMT_REQUIRED, 1, TOKENS_MAX, &hbt, why, whylen);
    json_decref(o);
    if (bad) return -EINVAL;
    if (out->n_hash_ids) out->hash_ids = text->hash_ids;
    if (out->n_answer_hash_ids) out->answer_hash_ids = text->answer_hash_ids;
    if (out->n_hash_ids || out->n_answer_hash_ids) out->hash_block_tokens = (uint32_t)hbt;
    if (cost) out->sched_cost = &text->sched_cost;
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
