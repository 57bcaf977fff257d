/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway through the official OpenAI SDK for Node (openai, pinned in
 * tests/node/package-lock.json, installed by `make deps`): models, completions and chat
 * whole and streamed (same text, the usage chunk), BadRequestError naming the field,
 * AuthenticationError, RateLimitError with Retry-After, a stream failing before its first
 * token. The checks are in tests/node/gateway_sdk.test.mjs (node's test runner); this suite
 * starts the real daemon and gateway and runs it. Skips when node or the SDK is absent.
 */
#include "test_gateway_harness.h"

TestSuite(gateway_node, .fini = gwh_stop_all, .timeout = 180);

Test(gateway_node, openai_sdk_for_node)
{
	gwh_need();
	char *out, *err;
	char *ver[] = {"node", "--version", NULL};
	if (gwh_run(ver, &out, &err, 20) != 0) cr_skip_test("node is not installed: the OpenAI SDK test skips");
	free(out);
	free(err);
	if (!gwh_exists("tests/node/node_modules/openai/package.json"))
		cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK test skips");
	char *keys = gwh_keys();
	const char *extra[] = {"--api-keys", keys, NULL};
	gwh_start_daemon();
	gwh_start_gateway(extra);
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
	setenv("GATEWAY_URL", url, 1);
	setenv("GATEWAY_KEY", "sk-alice-0001", 1);
	setenv("GATEWAY_TINY_KEY", "sk-tiny-00001", 1);
	/* The gateway answers once its session is up; the SDK test starts after that. */
	uint64_t dl = gwh_now_ms() + 10000;
	for (;;) {
		int fd = gwh_connect();
		const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
		gwh_send_all(fd, req, strlen(req));
		bool eof;
		char *r = gwh_read_until(fd, NULL, 5000, &eof);
		close(fd);
		bool ok = strstr(r, " 200 ") != NULL;
		free(r);
		if (ok) break;
		cr_assert(gwh_now_ms() < dl, "the gateway's /health is not 200 after 10 s");
		gwh_nap_ms(20);
	}
	char *argv[] = {"node", "--test", "--test-reporter=tap", "tests/node/gateway_sdk.test.mjs", NULL};
	int rc = gwh_run(argv, &out, &err, 120);
	cr_assert_eq(rc, 0, "the OpenAI SDK checks failed (exit %d):\n%s\n%s\ngateway log:\n%s", rc, out, err,
		     gwh_read_file(gwh_gateway.log));
	cr_assert(strstr(out, "# pass 7"), "expected 7 passing SDK checks:\n%s", out);
	free(out);
	free(err);
	free(keys);
}
