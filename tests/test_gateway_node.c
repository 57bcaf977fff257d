/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway through the official OpenAI SDK for Node (openai, pinned in
 * tests/node/package-lock.json, installed by `make deps`): models, completions and chat
 * whole and streamed (same text, the usage chunk, the prompt tokens the prefix cache served in
 * usage.prompt_tokens_details.cached_tokens), BadRequestError naming the field,
 * AuthenticationError, RateLimitError with Retry-After, a stream failing before its first
 * token. The checks are in tests/node/gateway_sdk.test.mjs (node's test runner); this suite
 * starts the real daemon and gateway and runs it. Skips when node or the SDK is absent.
 */
#include "libclient/ringlm.h"
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(gateway_node, .fini = gwh_stop_all, .timeout = 180);

Test(gateway_node, openai_sdk_for_node)
{
    gwh_need();
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    setenv("GATEWAY_KEY", "sk-alice-0001", 1);
    setenv("GATEWAY_TINY_KEY", "sk-tiny-00001", 1);
    gwh_wait_healthy(10000); /* the SDK checks start once the session is up */
    char *argv[] = {"node", "--test", "--test-reporter=tap", "tests/node/gateway_sdk.test.mjs",
                    NULL};
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0, "the OpenAI SDK checks failed (exit %d):\n%s\n%s\ngateway log:\n%s", rc,
                 out, err, th_read_file(gwh_gateway.log));
    cr_assert(strstr(out, "# pass 8"), "expected 8 passing SDK checks:\n%s", out);
    free(out);
    free(err);
    free(keys);
}

/* Log-probabilities through the SDK (tests/node/gateway_logprobs.test.mjs): chat's and
 * completions' shapes, whole and streamed, echo with max_tokens 0, vLLM's prompt_logprobs,
 * counts out of range. */
Test(gateway_node, logprobs_through_the_openai_sdk)
{
    gwh_need();
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    setenv("GATEWAY_KEY", "sk-alice-0001", 1);
    gwh_wait_healthy(10000);
    char *argv[] = {"node", "--test", "--test-reporter=tap", "tests/node/gateway_logprobs.test.mjs",
                    NULL};
    int rc = th_run(argv, &out, &err, 120);
    cr_assert_eq(rc, 0,
                 "the SDK's log-probability checks failed (exit %d):\n%s\n%s\ngateway log:\n%s", rc,
                 out, err, th_read_file(gwh_gateway.log));
    cr_assert(strstr(out, "# pass 5"), "expected 5 passing checks:\n%s", out);
    free(out);
    free(err);
    free(keys);
}

/* Structured output through the SDK: response_format json_schema on chat, whole and streamed,
 * and with n: 4 (tests/node/gateway_structured.test.mjs). */
Test(gateway_node, structured_output_through_the_openai_sdk)
{
    gwh_need();
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    /* every whitespace-only token of tok512 at -100: a 260K-parameter model sampled at
     * temperature 1 would otherwise wander in the whitespace JSON allows */
    char *tp = th_shared_file("models/tok512.bin");
    ringlm_tokenizer *t;
    cr_assert_eq(ringlm_tokenizer_load(tp, 512, &t), 0, "%s", ringlm_errdetail());
    char bias[8192] = "{";
    for (int32_t id = 0; id < 512; id++) {
        const char *p;
        if (ringlm_token_text(t, 3, id, &p) < 0 || !*p || strspn(p, " \t\r\n") != strlen(p))
            continue;
        snprintf(bias + strlen(bias), sizeof bias - strlen(bias), "%s\"%d\": -100",
                 bias[1] ? ", " : "", id);
    }
    strcat(bias, "}");
    ringlm_tokenizer_free(t);
    free(tp);
    setenv("NO_WS_BIAS", bias, 1);
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    setenv("GATEWAY_KEY", "sk-alice-0001", 1);
    gwh_wait_healthy(10000);
    char *argv[] = {"node", "--test", "--test-reporter=tap",
                    "tests/node/gateway_structured.test.mjs", NULL};
    int rc = th_run(argv, &out, &err, 150);
    cr_assert_eq(rc, 0,
                 "the SDK's structured-output checks failed (exit %d):\n%s\n%s\ngateway log:\n%s",
                 rc, out, err, th_read_file(gwh_gateway.log));
    cr_assert(strstr(out, "# pass 3"), "expected 3 passing checks:\n%s", out);
    free(out);
    free(err);
    free(keys);
}

/* n choices through the SDK (tests/node/gateway_n.test.mjs): `n: 3` on completions and chat,
 * whole and streamed, each choice as the single request with seed + i; best_of; n and
 * best_of out of range; n with echo and logprobs (the prompt's in every choice). */
Test(gateway_node, n_choices_through_the_openai_sdk)
{
    gwh_need();
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    setenv("GATEWAY_KEY", "sk-alice-0001", 1);
    gwh_wait_healthy(10000);
    char *argv[] = {"node", "--test", "--test-reporter=tap", "tests/node/gateway_n.test.mjs", NULL};
    int rc = th_run(argv, &out, &err, 180);
    cr_assert_eq(rc, 0, "the SDK's n checks failed (exit %d):\n%s\n%s\ngateway log:\n%s", rc, out,
                 err, th_read_file(gwh_gateway.log));
    cr_assert(strstr(out, "# pass 5"), "expected 5 passing checks:\n%s", out);
    free(out);
    free(err);
    free(keys);
}
