/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the Jinja interpreter of chat templates (model/jinja.c), parse and render.
 * fuzz-sources: model/jinja.c
 * fuzz-libs: -ljansson
 *
 * The input is a template. Whatever parses is rendered with a conversation of every message
 * shape a chat request carries (system, user, assistant with tool_calls and
 * reasoning_content, tool) and tools, under small bounds, so templates that loop, recurse or
 * grow end quickly: every outcome must be text or a clean error.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vars)
        vars = json_loads(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"},"
            " {\"role\": \"user\", \"content\": \" hi <think>x</think> \"},"
            " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\","
            "  \"tool_calls\": [{\"id\": \"a\", \"type\": \"function\", \"function\":"
            "  {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5, true, null]}}}]},"
            " {\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": \"ok\"}],"
            " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
            "  \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": "
            "\"array\"}}}}}],"
            " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true}",
            0, NULL);
    jinja_template *t;
    if (jinja_parse((const char *)data, size, &t) != 0) return 0;
    jinja_limits lim = {.max_output_bytes = 1 << 16,
                        .max_memory_bytes = 16 << 20,
                        .max_steps = 20000,
                        .max_depth = 100};
    char *text;
    size_t len;
    if (jinja_render(t, vars, &lim, &text, &len) == 0) free(text);
    jinja_free(t);
    return 0;
}
