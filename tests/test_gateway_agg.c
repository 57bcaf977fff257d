/* SPDX-License-Identifier: MIT */
/*
 * Several daemons' vllm:* families as one vLLM server's (gateway/gw_agg.h), alone: counters
 * and histogram buckets summed, request gauges summed, KV use over all blocks, one cache
 * configuration with the blocks summed, the LoRA info gauge once, model_name the gateway's;
 * a daemon whose scrape failed keeps its counters and loses its gauges.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "gateway/gw_agg.h"

TestSuite(gateway_agg);

static const char *const daemon_a =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{model_name=\"stories260K\",engine=\"0\"} 2\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{model_name=\"stories260K\",engine=\"0\"} 0.5\n"
    "# HELP vllm:request_success_total Count of successfully processed requests.\n"
    "# TYPE vllm:request_success_total counter\n"
    "vllm:request_success_total{model_name=\"stories260K\",engine=\"0\",finished_reason=\"stop\"} "
    "3\n"
    "vllm:request_success_total{model_name=\"stories260K\",engine=\"0\",finished_reason="
    "\"length\"} 1\n"
    "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n"
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"stories260K\",engine=\"0\",le=\"0.3\"} "
    "2\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"stories260K\",engine=\"0\",le=\"+Inf\"} "
    "4\n"
    "vllm:e2e_request_latency_seconds_sum{model_name=\"stories260K\",engine=\"0\"} 1.25\n"
    "vllm:e2e_request_latency_seconds_count{model_name=\"stories260K\",engine=\"0\"} 4\n"
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
    "vllm:lora_requests_info{max_lora=\"0\",waiting_lora_adapters=\"\",running_lora_adapters="
    "\"\"} 1700000000.5\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_blocks="
    "\"100\",num_cpu_blocks=\"0\",num_disk_blocks=\"0\",engine=\"0\"} 1\n";

static const char *const daemon_b =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{model_name=\"other\",engine=\"0\"} 1\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{model_name=\"other\",engine=\"0\"} 0.1\n"
    "# HELP vllm:request_success_total Count of successfully processed requests.\n"
    "# TYPE vllm:request_success_total counter\n"
    "vllm:request_success_total{model_name=\"other\",engine=\"0\",finished_reason=\"stop\"} 5\n"
    "vllm:request_success_total{model_name=\"other\",engine=\"0\",finished_reason=\"abort\"} 2\n"
    "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n"
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"other\",engine=\"0\",le=\"0.3\"} 7\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"other\",engine=\"0\",le=\"+Inf\"} 7\n"
    "vllm:e2e_request_latency_seconds_sum{model_name=\"other\",engine=\"0\"} 0.5\n"
    "vllm:e2e_request_latency_seconds_count{model_name=\"other\",engine=\"0\"} 7\n"
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
    "vllm:lora_requests_info{max_lora=\"0\",waiting_lora_adapters=\"\",running_lora_adapters="
    "\"\"} 1700000001.5\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_blocks="
    "\"300\",num_cpu_blocks=\"8\",num_disk_blocks=\"0\",engine=\"0\"} 1\n";

/* The line of series (exact name and labels) in text, or "" when absent (static copy). */
static const char *line_of(const char *text, const char *series)
{
    static char line[512];
    size_t n = strlen(series);
    for (const char *p = strstr(text, series); p; p = strstr(p + 1, series))
        if ((p == text || p[-1] == '\n') && p[n] == ' ') {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            if (len >= sizeof line) len = sizeof line - 1;
            memcpy(line, p, len);
            line[len] = 0;
            return line;
        }
    return "";
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

#define L(name, labels) name "{model_name=\"stories\",engine=\"0\"" labels "}"

Test(gateway_agg, two_daemons_read_as_one_server)
{
    const char *texts[2] = {daemon_a, daemon_b};
    bool up[2] = {true, true};
    char *t = gw_agg_vllm(texts, up, 2, "stories");
    cr_assert_not_null(t);
    cr_assert_str_eq(line_of(t, L("vllm:num_requests_running", "")),
                     L("vllm:num_requests_running", "") " 3", "%s", t);
    /* (0.5 × 100 + 0.1 × 300) / 400 blocks */
    cr_assert_str_eq(line_of(t, L("vllm:kv_cache_usage_perc", "")),
                     L("vllm:kv_cache_usage_perc", "") " 0.2", "%s", t);
    cr_assert_str_eq(line_of(t, L("vllm:request_success_total", ",finished_reason=\"stop\"")),
                     L("vllm:request_success_total", ",finished_reason=\"stop\"") " 8");
    cr_assert_str_eq(line_of(t, L("vllm:request_success_total", ",finished_reason=\"length\"")),
                     L("vllm:request_success_total", ",finished_reason=\"length\"") " 1");
    cr_assert_str_eq(line_of(t, L("vllm:request_success_total", ",finished_reason=\"abort\"")),
                     L("vllm:request_success_total", ",finished_reason=\"abort\"") " 2");
    cr_assert_str_eq(line_of(t, L("vllm:e2e_request_latency_seconds_bucket", ",le=\"0.3\"")),
                     L("vllm:e2e_request_latency_seconds_bucket", ",le=\"0.3\"") " 9");
    cr_assert_str_eq(line_of(t, L("vllm:e2e_request_latency_seconds_bucket", ",le=\"+Inf\"")),
                     L("vllm:e2e_request_latency_seconds_bucket", ",le=\"+Inf\"") " 11");
    cr_assert_str_eq(line_of(t, L("vllm:e2e_request_latency_seconds_sum", "")),
                     L("vllm:e2e_request_latency_seconds_sum", "") " 1.75");
    cr_assert_str_eq(line_of(t, L("vllm:e2e_request_latency_seconds_count", "")),
                     L("vllm:e2e_request_latency_seconds_count", "") " 11");
    /* one LoRA line, the latest time; one cache configuration, blocks summed */
    cr_assert_eq(count(t, "\nvllm:lora_requests_info{"), 1, "%s", t);
    cr_assert(strstr(t, "running_lora_adapters=\"\"} 1700000001.5\n"), "%s", t);
    cr_assert_eq(count(t, "\nvllm:cache_config_info{"), 1, "%s", t);
    cr_assert(strstr(t, "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\","
                        "num_gpu_blocks=\"400\",num_cpu_blocks=\"8\",num_disk_blocks=\"0\","
                        "engine=\"0\"} 1\n"),
              "%s", t);
    /* every family once, with its HELP and TYPE, in the first daemon's order */
    cr_assert_eq(count(t, "# TYPE vllm:request_success_total counter\n"), 1);
    cr_assert_eq(count(t, "# TYPE "), 6, "%s", t);
    cr_assert(strstr(t, "# TYPE vllm:num_requests_running gauge") <
              strstr(t, "# TYPE vllm:cache_config_info gauge"));
    cr_assert_null(strstr(t, "model_name=\"other\""));
    cr_assert_null(strstr(t, "model_name=\"stories260K\""));
    free(t);
}

Test(gateway_agg, a_lost_daemon_keeps_its_counters_and_loses_its_gauges)
{
    const char *texts[2] = {daemon_a, daemon_b};
    bool up[2] = {true, false};
    char *t = gw_agg_vllm(texts, up, 2, "stories");
    cr_assert_str_eq(line_of(t, L("vllm:num_requests_running", "")),
                     L("vllm:num_requests_running", "") " 2", "%s", t);
    cr_assert_str_eq(line_of(t, L("vllm:kv_cache_usage_perc", "")),
                     L("vllm:kv_cache_usage_perc", "") " 0.5", "%s", t);
    cr_assert_str_eq(line_of(t, L("vllm:request_success_total", ",finished_reason=\"stop\"")),
                     L("vllm:request_success_total", ",finished_reason=\"stop\"") " 8",
                     "a counter went back while a daemon was away: %s", t);
    cr_assert(strstr(t, "num_gpu_blocks=\"100\""), "%s", t);
    free(t);
    up[0] = false;
    t = gw_agg_vllm(texts, up, 2, "stories");
    cr_assert_str_eq(t, "", "nothing answers: nothing is relayed");
    free(t);
    const char *never[2] = {NULL, daemon_b};
    up[1] = true;
    t = gw_agg_vllm(never, up, 2, "stories");
    cr_assert_str_eq(line_of(t, L("vllm:num_requests_running", "")),
                     L("vllm:num_requests_running", "") " 1", "%s", t);
    free(t);
}
