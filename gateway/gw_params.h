/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_params.h — an OpenAI-shaped request body (completions or chat completions) to
 * the parameters of one ringlm request, and errors in the OpenAI shape.
 *
 * The fields: one table (gw_fields, the same as docs/gateway.md's "Fields" table, which a
 * test walks), each implemented, ignored (documented: `user`) or refused with a 400 naming it
 * (a refused field at its neutral value, such as "n": 1, is accepted). A field not in the
 * table is refused too: no field is ever silently ignored. null is the same as absent; a
 * wrong type is a 400 naming the field. A tenant named in the body is refused: the tenant
 * comes from the API key.
 */
#ifndef RINGLM_TOOLS_GW_PARAMS_H
#define RINGLM_TOOLS_GW_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/api_keys.h"
#include "libclient/ringlm.h"
#include "gateway/gw_text.h"

typedef enum gw_kind { GW_COMPLETION = 0, GW_CHAT = 1 } gw_kind;

/* An error answer: HTTP status and the OpenAI error object's fields. */
typedef struct gw_err {
    int status;       /* 400, 401, 404, 413, 429, 500, 503, 504 */
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* "invalid_value", "queue_full", ... (static) or NULL */
    char param[48];   /* the field at fault, "" when none */
    char message[800];
} gw_err;

__attribute__((format(printf, 5, 6))) void gw_err_set(gw_err *e, int status, const char *code,
                                                      const char *param, const char *fmt, ...);
/* A request body parsed as JSON (duplicate keys refused), or NULL with e set: 400
 * invalid_json naming where it broke. */
struct json_t;
struct json_t *gw_json_body(const char *body, size_t len, gw_err *e);
/* {"error":{"message","type","param","code"}} as text (malloc'ed), or NULL. */
char *gw_err_json(const gw_err *e);

#define GW_LP_NONE (-2147483647 - 1) /* gw_params.logprobs / prompt_logprobs: not asked */

typedef struct gw_params {
    gw_kind kind;
    char *prompt_text;   /* text prompt (completions) or the rendered chat; NULL when ids */
    int32_t *prompt_ids; /* token-id prompt (completions), NULL when text */
    uint32_t n_prompt_ids;
    long max_tokens;    /* -1: the endpoint's default */
    double temperature; /* default 1 (as the OpenAI API) */
    double top_p;       /* default 1 */
    uint32_t top_k;     /* 0 = off (-1 is accepted as off, as vLLM does) */
    uint64_t seed;
    bool has_seed;
    gw_stop stop; /* strings owned by the params */
    bool stream;
    bool include_usage;
    bool ignore_eos;
    int logprobs;        /* top alternatives per generated token as the body says (the check
                            refuses a negative one), GW_LP_NONE: not asked (completions:
                            "logprobs" N; chat: "top_logprobs" when "logprobs" is true) */
    bool echo;           /* completions: the prompt comes back before the answer */
    int prompt_logprobs; /* per prompt token (vLLM's), GW_LP_NONE: not asked */
    uint32_t n;          /* choices answered (default 1) */
    uint32_t best_of;    /* completions: samples drawn, the n of the highest cumulative
                            log-probability answered (vLLM's); 0 when not given (= n) */
    char class_name[GW_NAME_MAX]; /* "" = the key's default class */
    uint64_t deadline_ms;         /* 0 = none */
    /* logit_bias, the penalties, min_p, stop_token_ids (ringlm_sampling_init's values when
     * absent); its lists are bias and stop_ids below, owned by the params */
    ringlm_sampling smp;
    ringlm_logit_bias *bias;
    int32_t *stop_ids;
    /* structured output (smp.constraint_kind, smp.constraint): the constraint's text, owned
     * here, and the body field it came from ("response_format", "guided_json", ...), which a
     * 400 about it names (NULL: none) */
    char *constraint;
    const char *constraint_param;
    /* tools (chat): the answer's tool calls are parsed out of its text with this parser
     * (GW_TOOLS_*, gw_tools.h; 0: the answer is text), at most max_tool_calls of them (0: no
     * bound; parallel_tool_calls false: 1) */
    int tool_parser;
    int max_tool_calls;
    char *tool_name; /* tool_choice naming a function (tool_parser GW_TOOLS_NAMED): its name */
} gw_params;

/* The fields of a request body, as docs/gateway.md's table lists them. */
typedef enum gw_field_status {
    GW_FIELD_IMPLEMENTED = 0,
    GW_FIELD_IGNORED = 1, /* accepted and not used (documented) */
    GW_FIELD_REFUSED = 2, /* a 400 naming it, unless it is at its neutral value */
} gw_field_status;
#define GW_EP_COMPLETIONS 1u
#define GW_EP_CHAT        2u
typedef struct gw_field {
    const char *name;
    unsigned endpoints; /* GW_EP_* where the field exists */
    gw_field_status status;
    const char *neutral; /* JSON of the value accepted even when refused (NULL: none) */
    const char *why;     /* refused: the 400's reason */
} gw_field;
/* The table and its length. */
const gw_field *gw_fields(size_t *n);
const char *gw_field_status_name(gw_field_status s); /* "implemented", "ignored", "refused" */

typedef struct gw_parse_cfg {
    const char *served_model; /* names the model requests must name (when they name one) */
    int tpl;                  /* RINGLM_CHAT_* (libclient's chat templates) */
    const struct ringlm_chat_jinja *jinja; /* the model file's template; NULL: tpl */
    unsigned jinja_strip; /* RINGLM_CHAT_JINJA_STRIP_*: what the tokenizer adds itself */
    int tool_parser;      /* GW_TOOLS_*: the model's tool-call syntax (0: none known) */
} gw_parse_cfg;

/* Parses body[0..len). Returns 0 and *p (free with gw_params_free), or -1 with *e set. */
int gw_params_parse(gw_kind kind, const char *body, size_t len, const gw_parse_cfg *cfg,
                    gw_params *p, gw_err *e);
void gw_params_free(gw_params *p);

/* The one parameter check (ringlm_request_check_ext, which ringlm_submit_ext and ringlmd
 * apply too; vocab: the tokenizer's vocabulary, 0 when the gateway has none) on the request
 * built from p and p->smp: 0, or -1 with a 400 invalid_value naming the body's field
 * ("temperature", "top_p", "max_tokens", "ringlm.deadline_ms", "prompt"). The parser reads
 * types only; every range is this check's, so the gateway, the library and the daemon refuse
 * the same requests with the same words. */
int gw_params_check(const gw_params *p, const ringlm_request *rq, const ringlm_sampling *smp,
                    int vocab, gw_err *e);

/* Sets p's constraint: kind (RINGLM_CONSTRAINT_*), its text (copied; len bytes, NUL bytes
 * separate a choice's alternatives; NULL/0 for json_object), and param, the body field that
 * asked (a static string, named by any 400 about it: a constraint that does not compile
 * comes back from ringlmd as a 400 invalid_value naming it, with the compiler's words).
 * The request's fields that ask for output constraints (response_format, guided_*,
 * structured_outputs, grammar, json_schema) call it; so may any other field that means one
 * (tool_choice "required"). A second constraint is a 400 naming both. 0, or -1 with e. */
int gw_params_set_constraint(gw_params *p, uint32_t kind, const char *text, size_t len,
                             const char *param, gw_err *e);

/* The sampling extensions p asks for into *smp (logit_bias, penalties, min_p, stop ids,
 * log-probabilities — echo + logprobs asks for the prompt's —, the constraint, and the
 * samples: max(n, best_of), best_of > n asking for each token's log-probability to rank them
 * by): true when
 * any differs from a plain request, false when the request is a plain one. */
bool gw_params_sampling(const gw_params *p, ringlm_sampling *smp);

#endif
