/* SPDX-License-Identifier: MIT */
/*
 * gateway/gw_agg.h — the vllm:* families of several daemons as one vLLM server's (the
 * gateway's /metrics over one ringlmd per NUMA node; docs/fleet.md says why one server and
 * not one series per daemon).
 *
 * Input: each daemon's vllm:* lines in the Prometheus text format (HELP, TYPE, samples; the
 * samples of a family after its TYPE), as ringlmd renders them. Output: every family once, in
 * the order first seen, each sample (name and labels) once:
 *   - counters and histograms (buckets, _sum, _count): the sum over the daemons — a daemon
 *     whose last scrape failed counts with its last copy, so a counter never goes back while
 *     a daemon is away (when it restarts, its counters restart, as a server's do);
 *   - gauges: the sum over the daemons that answered (requests running, waiting), except
 *       vllm:kv_cache_usage_perc: blocks held over all blocks, each daemon's use weighted
 *         by its device blocks (num_gpu_blocks of its vllm:cache_config_info);
 *       vllm:cache_config_info: one series, num_gpu_blocks / num_cpu_blocks /
 *         num_disk_blocks summed, the other labels the first daemon's, value 1;
 *       any other *_info gauge (vllm:lora_requests_info, whose value is a time): the largest;
 *   - the label model_name says `model` (the gateway's served model name) whatever the
 *     daemons call it.
 * Nothing at all when no daemon answered.
 *
 * Pure: no I/O, no locks.
 */
#ifndef RINGLM_GATEWAY_GW_AGG_H
#define RINGLM_GATEWAY_GW_AGG_H

#include <stdbool.h>

/* texts[i]: daemon i's lines (NULL: never scraped), up[i]: its last scrape answered (texts[i]
 * is then that scrape's, else the last good one). A malloc()ed text ("" when nothing is up),
 * or NULL when out of memory. */
char *gw_agg_vllm(const char *const *texts, const bool *up, int n, const char *model);

#endif
