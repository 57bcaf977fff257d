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

/* Skips the test when node or the OpenAI SDK is not installed. */
static void need_node_sdk(void)
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
}

/* Starts the daemon and the gateway (with gwh_keys' API keys), points the script at it
 * (GATEWAY_URL, GATEWAY_KEY: alice's key) and runs tests/node/<script> with node's test
 * runner within timeout_s: it must exit 0 with n_pass checks passing; `what` names the checks
 * in a failure. */
static void run_sdk_checks(const char *script, const char *what, int n_pass, int timeout_s)
{
    char *keys = gwh_keys();
    const char *extra[] = {"--api-keys", keys, NULL};
    gwh_start_daemon(NULL);
    gwh_start_gateway(extra);
    char url[64], path[128], pass[32];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    setenv("GATEWAY_KEY", "sk-alice-0001", 1);
    gwh_wait_healthy(10000); /* the SDK checks start once the session is up */
    snprintf(path, sizeof path, "tests/node/%s", script);
    char *out, *err;
    char *argv[] = {"node", "--test", "--test-reporter=tap", path, NULL};
    int rc = th_run(argv, &out, &err, timeout_s);
    cr_assert_eq(rc, 0, "%s failed (exit %d):\n%s\n%s\ngateway log:\n%s", what, rc, out, err,
                 th_read_file(gwh_gateway.log));
    snprintf(pass, sizeof pass, "# pass %d", n_pass);
    cr_assert(strstr(out, pass), "expected %d passing checks of %s:\n%s", n_pass, what, out);
    free(out);
    free(err);
    free(keys);
}

Test(gateway_node, openai_sdk_for_node)
{
    need_node_sdk();
    setenv("GATEWAY_TINY_KEY", "sk-tiny-00001", 1);
    run_sdk_checks("gateway_sdk.test.mjs", "the OpenAI SDK checks", 8, 120);
}

/* Log-probabilities through the SDK (tests/node/gateway_logprobs.test.mjs): chat's and
 * completions' shapes, whole and streamed, echo with max_tokens 0, vLLM's prompt_logprobs,
 * counts out of range. */
Test(gateway_node, logprobs_through_the_openai_sdk)
{
    need_node_sdk();
    run_sdk_checks("gateway_logprobs.test.mjs", "the SDK's log-probability checks", 5, 120);
}

/* Structured output through the SDK: response_format json_schema on chat, whole and streamed,
 * and with n: 4 (tests/node/gateway_structured.test.mjs). */
Test(gateway_node, structured_output_through_the_openai_sdk)
{
    need_node_sdk();
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
    run_sdk_checks("gateway_structured.test.mjs", "the SDK's structured-output checks", 3, 150);
}

/* n choices through the SDK (tests/node/gateway_n.test.mjs): `n: 3` on completions and chat,
 * whole and streamed, each choice as the single request with seed + i; best_of; n and
 * best_of out of range; n with echo and logprobs (the prompt's in every choice). */
Test(gateway_node, n_choices_through_the_openai_sdk)
{
    need_node_sdk();
    run_sdk_checks("gateway_n.test.mjs", "the SDK's n checks", 5, 180);
}
