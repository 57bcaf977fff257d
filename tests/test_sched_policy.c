/* SPDX-License-Identifier: MIT */
/* Policy text: parse errors carry line and reason, canonical form and hash equality, uid
 * mapping and trust, the example policy, and the event JSON writer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/event_json.h"
#include "sched/sched.h"

static sched_policy *parse_ok(const char *text)
{
    sched_policy *p = NULL;
    sched_policy_error err;
    int rc = sched_policy_parse(text, &p, &err);
    cr_assert_eq(rc, 0, "parse failed: line %d: %s\n--- text ---\n%s", err.line, err.reason, text);
    return p;
}

static void parse_bad(const char *text, int line, const char *needle)
{
    sched_policy *p = (sched_policy *)1;
    sched_policy_error err;
    int rc = sched_policy_parse(text, &p, &err);
    cr_assert_eq(rc, -EINVAL, "expected -EINVAL for:\n%s", text);
    cr_assert_null(p);
    cr_assert_eq(err.line, line, "line %d, expected %d (%s) for:\n%s", err.line, line, err.reason,
                 text);
    cr_assert(strstr(err.reason, needle), "reason \"%s\" lacks \"%s\"", err.reason, needle);
    cr_assert(strstr(sched_last_error(), needle), "last_error \"%s\"", sched_last_error());
}

Test(sched_policy, errors_name_line_and_reason)
{
    parse_bad("[scheduler]\nmode = fast\n", 2, "expected static|dynamic|continuous|token_budget");
    parse_bad("[scheduler]\ntoken_budget = 0\n", 2, "must be >= 1");
    parse_bad("[scheduler]\ntoken_budget = 12x\n", 2, "whole number");
    parse_bad("[scheduler]\ntoken_budget = -5\n", 2, "whole number");
    parse_bad("# c\n\n[scheduler]\nbogus = 1\n", 4, "unknown key \"bogus\"");
    parse_bad("[scheduler]\ntoken_budget = 1\ntoken_budget = 2\n", 3, "given twice");
    parse_bad("token_budget = 1\n", 1, "outside any section");
    parse_bad("[tenant a]\nweight = 0\n", 2, "must be > 0");
    parse_bad("[tenant a]\nweight = nan\n", 2, "expected a number");
    parse_bad("[tenant a]\n[tenant a]\n", 2, "defined twice");
    parse_bad("[tenant a]\nuids = 5\n[tenant b]\nuids = 7 5\n", 4, "already mapped");
    parse_bad("[class x y]\n", 1, "name");
    parse_bad("[klass x]\n", 1, "unknown section");
    parse_bad("[class c]\nmax_queue_wait = 5 minutes\n", 2, "duration");
    parse_bad("[class c]\nlatency_sensitive = maybe\n", 2, "yes or no");
    parse_bad("[scheduler\n", 1, "section header");
    parse_bad("[scheduler]\njust words\n", 2, "expected key = value");
    parse_bad("[scheduler]\ndefault_class = nope\n[class a]\n", 2, "no class named \"nope\"");
    parse_bad("[scheduler]\ndefault_tenant = ghost\n", 2, "no tenant named \"ghost\"");
    parse_bad("[scheduler]\ntoken_budget = 64\ndecode_reserve_tokens = 64\n", 0,
              "decode_reserve_tokens");
    parse_bad("[scheduler]\nmode = static\x01\n", 2, "control character");
    parse_bad("[tenant a]\ncache_domain = two words\n", 2, "domain name");
    parse_bad("[tenant a]\ncache_domain =\n", 2, "domain name");
    parse_bad("[tenant a]\nmax_cached_blocks = -1\n", 2, "whole number");
}

/* Cache domains: each tenant its own unless the policy groups tenants; the salt the daemon
 * passes with a request depends on the domain alone. */
Test(sched_policy, cache_domains_group_tenants_and_name_their_salt)
{
    sched_policy *p = parse_ok("[tenant alice]\ncache_domain = gw\nmax_cached_blocks = 100\n"
                               "[tenant bob]\ncache_domain = gw\n[tenant carol]\n[tenant dave]\n"
                               "cache_domain = carol\n");
    int a = sched_policy_tenant_index(p, "alice"), b = sched_policy_tenant_index(p, "bob"),
        c = sched_policy_tenant_index(p, "carol"), d = sched_policy_tenant_index(p, "dave");
    cr_assert_str_eq(sched_policy_tenant(p, a)->cache_domain, "gw");
    cr_assert_str_eq(sched_policy_tenant(p, c)->cache_domain, "carol", "default: its own name");
    cr_assert_eq(sched_policy_tenant(p, a)->max_cached_blocks, 100);
    cr_assert_eq(sched_policy_tenant(p, b)->max_cached_blocks, 0, "default: unlimited");
    cr_assert_eq(sched_policy_cache_salt(p, a), sched_policy_cache_salt(p, b),
                 "one domain, one salt");
    cr_assert_neq(sched_policy_cache_salt(p, a), sched_policy_cache_salt(p, c));
    cr_assert_eq(sched_policy_cache_salt(p, d), sched_policy_cache_salt(p, c),
                 "dave joined carol's domain");
    cr_assert_neq(sched_policy_cache_salt(p, a), 0);
    cr_assert_eq(sched_policy_cache_salt(p, 99), 0);
    cr_assert(strstr(sched_policy_canonical(p), "cache_domain = gw\nmax_cached_blocks = 100\n"));
    /* a domain's salt does not depend on which other tenants the policy has */
    sched_policy *q = parse_ok("[tenant zed]\ncache_domain = gw\n");
    cr_assert_eq(sched_policy_cache_salt(q, 0), sched_policy_cache_salt(p, a));
    /* naming a tenant's own domain is the default spelt out: the same policy */
    sched_policy *r =
        parse_ok("[tenant alice]\ncache_domain = gw\nmax_cached_blocks = 100\n"
                 "[tenant bob]\ncache_domain = gw\n[tenant carol]\ncache_domain = carol\n"
                 "[tenant dave]\ncache_domain = carol\nmax_cached_blocks = 0\n");
    cr_assert_str_eq(sched_policy_canonical(r), sched_policy_canonical(p));
    sched_policy *rt = parse_ok(sched_policy_canonical(p));
    cr_assert_str_eq(sched_policy_canonical(rt), sched_policy_canonical(p));
    sched_policy_free(p);
    sched_policy_free(q);
    sched_policy_free(r);
    sched_policy_free(rt);
}

Test(sched_policy, equivalent_files_hash_the_same)
{
    const char *a =
        "[scheduler]\nmode = token_budget\nmin_residency = 20ms\n"
        "[class chat]\npriority = 10\nlatency_sensitive = yes\nttft_target = 0.5s\n"
        "[class batch]\n"
        "[tenant b]\nweight = 2\nuids = 1002, 1001\n[tenant a]\nuids = 1000\n[trust]\nuids = 0\n";
    const char *b = "; same policy, other order, units, spacing, comments, defaults spelt out\n"
                    "[trust]\nuids=0\n"
                    "[tenant a]\n  uids = 1000   # alice\n weight = 1.0\n"
                    "[tenant b]\nuids = 1001 1002\nweight=2.00\n"
                    "[class batch]\npriority = 0\naging_per_s = 1\n"
                    "[class chat]\nlatency_sensitive = true\npriority=10\nttft_target = 500000us\n"
                    "[scheduler]\nmin_residency = 20000\ntoken_budget = 512\n";
    sched_policy *pa = parse_ok(a), *pb = parse_ok(b);
    cr_assert_str_eq(sched_policy_canonical(pa), sched_policy_canonical(pb));
    cr_assert_eq(sched_policy_hash(pa), sched_policy_hash(pb));
    cr_assert_str_eq(sched_policy_hash_hex(pa), sched_policy_hash_hex(pb));
    cr_assert_eq(strlen(sched_policy_hash_hex(pa)), SCHED_HASH_HEX_LEN);

    /* the canonical text parses back to itself */
    sched_policy *pc = parse_ok(sched_policy_canonical(pa));
    cr_assert_str_eq(sched_policy_canonical(pc), sched_policy_canonical(pa));

    /* a real change changes the hash */
    sched_policy *pd =
        parse_ok("[scheduler]\nmin_residency = 21ms\n[class chat]\npriority = 10\n"
                 "latency_sensitive = yes\nttft_target = 0.5s\n[class batch]\n"
                 "[tenant b]\nweight = 2\nuids = 1002, 1001\n[tenant a]\nuids = 1000\n"
                 "[trust]\nuids = 0\n");
    cr_assert_neq(sched_policy_hash(pd), sched_policy_hash(pa));
    sched_policy_free(pa);
    sched_policy_free(pb);
    sched_policy_free(pc);
    sched_policy_free(pd);
}

Test(sched_policy, defaults_uids_and_trust)
{
    sched_policy *p = parse_ok("");
    cr_assert_eq(sched_policy_n_classes(p), 1);
    cr_assert_eq(sched_policy_n_tenants(p), 1);
    cr_assert_str_eq(sched_policy_class(p, 0)->name, "default");
    cr_assert_eq(sched_policy_tenant_for_uid(p, 12345), 0, "implicit default tenant takes any uid");
    cr_assert_eq(sched_policy_get(p)->mode, SCHED_MODE_TOKEN_BUDGET);
    sched_policy_free(p);

    p = parse_ok("[tenant x]\nuids = 10 11\n[tenant y]\nuids = 20\n[trust]\nuids = 0 99\n");
    int x = sched_policy_tenant_index(p, "x"), y = sched_policy_tenant_index(p, "y");
    cr_assert_eq(sched_policy_tenant_for_uid(p, 11), x);
    cr_assert_eq(sched_policy_tenant_for_uid(p, 20), y);
    cr_assert_eq(sched_policy_tenant_for_uid(p, 30), -ENOENT,
                 "no default tenant: unmapped uid refused");
    cr_assert(sched_policy_uid_trusted(p, 99));
    cr_assert(!sched_policy_uid_trusted(p, 10));
    cr_assert_eq(sched_policy_tenant_index(p, "nope"), -ENOENT);
    cr_assert_eq(sched_policy_class_index(p, NULL), 0);
    sched_policy_free(p);

    p = parse_ok("[scheduler]\ndefault_tenant = y\n[tenant x]\nuids = 10\n[tenant y]\n");
    cr_assert_eq(sched_policy_tenant_for_uid(p, 30), sched_policy_tenant_index(p, "y"));
    sched_policy_free(p);
}

Test(sched_policy, example_policy_parses)
{
    FILE *f = fopen("sched/example.policy", "r");
    if (!f) cr_skip_test("sched/example.policy not found (run from the repository root)");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    sched_policy *p = parse_ok(buf);
    cr_assert_eq(sched_policy_n_classes(p), 2);
    cr_assert_eq(sched_policy_n_tenants(p), 3);
    cr_assert_eq(sched_policy_tenant_for_uid(p, 1001), sched_policy_tenant_index(p, "team-a"));
    cr_assert_eq(sched_policy_tenant_for_uid(p, 4242), sched_policy_tenant_index(p, "shared"));
    cr_assert(sched_policy_uid_trusted(p, 0));
    cr_assert_eq(sched_policy_get(p)->min_residency_us, 50000);
    cr_assert_eq(sched_policy_class(p, sched_policy_class_index(p, "chat"))->ttft_target_us,
                 500000);
    sched_policy_free(p);
}

Test(sched_policy, names_are_stable)
{
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_QUEUE_FULL), "queue_full");
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_NEVER_FITS), "never_fits");
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_TOO_LONG), "too_long");
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_TENANT_QUOTA), "tenant_quota");
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_DEADLINE), "deadline_infeasible");
    cr_assert_str_eq(sched_reject_name(SCHED_REJECT_UNKNOWN_CLASS), "unknown_class");
    cr_assert_str_eq(sched_defer_name(SCHED_DEFER_BACKPRESSURE), "output_backpressure");
    cr_assert_str_eq(sched_cancel_name(SCHED_CANCEL_DISCONNECT), "disconnect");
    cr_assert_str_eq(sched_event_name(SCHED_EV_SWAP_IN), "swap_in");
    cr_assert_str_eq(sched_mode_name(SCHED_MODE_CONTINUOUS), "continuous");
    cr_assert_str_eq(sched_reject_name((sched_reject_reason)999), "?");
}

Test(sched_policy, event_json_schema)
{
    sched_event e = {.t_us = 1500,
                     .kind = SCHED_EV_PREEMPT,
                     .req = 7,
                     .tenant = "a",
                     .class_name = "chat",
                     .defer = SCHED_DEFER_BLOCKS,
                     .mode = SCHED_PREEMPT_SWAP,
                     .blocks = 12,
                     .swap_cost_us = 812.25,
                     .recompute_cost_us = 1400};
    char buf[512];
    int n = event_json(&e, buf, sizeof buf);
    cr_assert_eq(n, (int)strlen(buf));
    cr_assert_str_eq(
        buf, "{\"t_us\":1500,\"ev\":\"preempt\",\"req\":7,\"tenant\":\"a\",\"class\":\"chat\","
             "\"reason\":\"blocks\",\"mode\":\"swap\",\"blocks\":12,\"swap_cost_us\":812.2,"
             "\"recompute_cost_us\":1400.0}");
    sched_event r = {.t_us = 2,
                     .kind = SCHED_EV_RELEASE,
                     .req = 3,
                     .tenant = "t\"x",
                     .class_name = "c",
                     .blocks = 4,
                     .pool = SCHED_POOL_HOST};
    event_json(&r, buf, sizeof buf);
    cr_assert_str_eq(
        buf, "{\"t_us\":2,\"ev\":\"release\",\"req\":3,\"tenant\":\"t\\\"x\",\"class\":\"c\","
             "\"pool\":\"host\",\"blocks\":4}");
    /* a line that does not fit is refused whole, never cut */
    char small[16];
    cr_assert_eq(event_json(&r, small, sizeof small), -EMSGSIZE);
}

Test(sched_policy, crlf_bom_and_long_uid_lists)
{
    sched_policy *a =
        parse_ok("\xEF\xBB\xBF[scheduler]\r\ntoken_budget = 300\r\n[tenant t]\r\nuids = 5\r\n");
    sched_policy *b = parse_ok("[scheduler]\ntoken_budget = 300\n[tenant t]\nuids = 5\n");
    cr_assert_eq(sched_policy_hash(a), sched_policy_hash(b));
    static char text[16000];
    size_t n = (size_t)snprintf(text, sizeof text, "[tenant big]\nuids =");
    for (int u = 0; u < 1000; u++)
        n += (size_t)snprintf(text + n, sizeof text - n, " %d", 100000 + u);
    snprintf(text + n, sizeof text - n, "\n");
    sched_policy *c = parse_ok(text);
    cr_assert_eq(sched_policy_tenant_for_uid(c, 100999), 0);
    cr_assert_eq(sched_policy_tenant_for_uid(c, 101000), -ENOENT);
    sched_policy_free(a);
    sched_policy_free(b);
    sched_policy_free(c);
}

/* A class or tenant name no client can put in a request record (the wire's name field holds
 * SCHED_NAME_MAX - 1 characters) is refused when the policy loads, not found unreachable
 * later. */
Test(sched_policy, names_fit_what_a_client_can_request)
{
    cr_assert_eq(SCHED_NAME_MAX, 16);
    sched_policy *p = parse_ok("[class abcdefghijklmno]\n[tenant ABCDEFGHIJKLMNO]\n"); /* 15 */
    cr_assert_eq(sched_policy_class_index(p, "abcdefghijklmno"), 0);
    sched_policy_free(p);
    parse_bad("[class abcdefghijklmnop]\n", 1, "must be 1-15 characters");
    parse_bad("[class a]\n[tenant interactive-users]\n", 2, "must be 1-15 characters");
}
