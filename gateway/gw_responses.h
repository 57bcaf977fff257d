/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_responses.h — OpenAI's Responses API (POST /v1/responses) as vLLM serves it, on
 * top of chat completions: a Responses body becomes the chat request it means (instructions
 * and input items as messages, function tools, tool_choice, max_output_tokens, ...), and
 * the answer comes back as a response object with output items (message with output_text,
 * function_call, reasoning), whole or as the response.* events.
 *
 * Its fields are one table of their own (gw_responses_fields, the same as docs/gateway.md's
 * "Responses fields" table): each implemented, ignored or refused with a 400 naming it, as
 * chat's; a field in no row is refused. Nothing is stored: `store: true` and
 * `previous_response_id` are refused.
 */
#ifndef RINGLM_GATEWAY_GW_RESPONSES_H
#define RINGLM_GATEWAY_GW_RESPONSES_H

#include <jansson.h>
#include <stddef.h>

#include "gateway/gw_params.h"

/* The table and its length (gw_field's endpoints is GW_EP_RESPONSES). */
#define GW_EP_RESPONSES 4u
const gw_field *gw_responses_fields(size_t *n);

/* Parses a Responses body into the chat request's parameters *p (free with gw_params_free)
 * and *resp, the response object's fields that echo the request (instructions, tools,
 * tool_choice, temperature, ...; a new reference). Returns 0, or -1 with *e set (its param
 * is the Responses field's name). */
int gw_responses_parse(const char *body, size_t len, const gw_parse_cfg *cfg, gw_params *p,
                       json_t **resp, gw_err *e);

#endif
