/* SPDX-License-Identifier: MIT */
/* sched.c — scheduler core (stub while the implementation lands; the API is sched.h). */
#include "sched/sched.h"

#include <errno.h>
#include <stddef.h>

int sched_create(const sched_policy *policy, const sched_config *cfg, sched_event_fn sink,
                 void *sink_ctx, uint64_t seed, sched **out)
{
    (void)policy; (void)cfg; (void)sink; (void)sink_ctx; (void)seed;
    if (out) *out = NULL;
    return -ENOSYS;
}
void sched_destroy(sched *s) { (void)s; }
int sched_submit(sched *s, const sched_request *req, uint64_t now_us, sched_reject_reason *reason)
{
    (void)s; (void)req; (void)now_us;
    if (reason) *reason = SCHED_REJECT_INVALID;
    return -ENOSYS;
}
int sched_cancel(sched *s, uint64_t id, uint64_t now_us, sched_cancel_reason reason)
{ (void)s; (void)id; (void)now_us; (void)reason; return -ENOSYS; }
int sched_set_output_blocked(sched *s, uint64_t id, bool blocked, uint64_t now_us)
{ (void)s; (void)id; (void)blocked; (void)now_us; return -ENOSYS; }
const sched_plan *sched_step(sched *s, uint64_t now_us) { (void)s; (void)now_us; return NULL; }
int sched_commit(sched *s, const sched_result *results, size_t n, uint64_t now_us,
                 uint64_t step_duration_us)
{ (void)s; (void)results; (void)n; (void)now_us; (void)step_duration_us; return -ENOSYS; }
int sched_transfer_done(sched *s, uint64_t transfer_id, uint64_t now_us, uint64_t bytes,
                        uint64_t duration_us, int status)
{ (void)s; (void)transfer_id; (void)now_us; (void)bytes; (void)duration_us; (void)status; return -ENOSYS; }
void sched_get_counts(const sched *s, sched_counts *out) { (void)s; (void)out; }
int sched_get_tenant_stats(const sched *s, int tenant, sched_group_stats *out)
{ (void)s; (void)tenant; (void)out; return -ENOSYS; }
int sched_get_class_stats(const sched *s, int class_idx, sched_group_stats *out)
{ (void)s; (void)class_idx; (void)out; return -ENOSYS; }
int sched_get_request(const sched *s, uint64_t id, sched_req_info *out)
{ (void)s; (void)id; (void)out; return -ENOSYS; }
const sched_policy *sched_get_policy(const sched *s) { (void)s; return NULL; }
int sched_check_invariants(const sched *s, char *why, size_t why_len)
{ (void)s; (void)why; (void)why_len; return -ENOSYS; }
