/* SPDX-License-Identifier: MIT */
/*
 * daemon/uidtenants.c — the built-in policy's tenants: one per uid. With no --policy, every
 * local user gets its own queue, its own fair share and its own quota, and is named "uid<N>"
 * in the decision and request logs and the metrics.
 *
 * The scheduler's tenants are a fixed set of indices (SCHED_MAX_TENANTS): the built-in
 * policy declares SVC_UID_TENANTS of them ("uid-slot-NN") plus one "other-uids", and the
 * daemon binds a slot to a uid when that uid connects. A slot stays bound while the uid has
 * a session and after it leaves, so a uid that reconnects finds its own fair-share counter
 * (disconnecting does not wipe a debt). A slot is taken over by another uid only when every
 * slot is bound, its uid has no session, and the scheduler has released all of its requests
 * and blocks (sched_tenant_recycle: the counter restarts level with the others'); the least
 * recently used such slot goes first. When every slot belongs to a uid with a session, a
 * further uid shares "other-uids" (said on stderr, rate-limited). The prefix cache's domain
 * is the uid, not the slot: a new owner never hits the old owner's cached prompts.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/service_internal.h"

bool ut_builtin_text(char *buf, size_t cap, const char *scheduler_section)
{
    size_t n = (size_t)snprintf(buf, cap, "%sdefault_tenant = other-uids\n", scheduler_section);
    /* Each uid's queued-prompt quota is the tuned single-tenant one; the global request bound
     * (queue_max_requests) keeps the sum bounded. */
    for (int i = 0; i <= SVC_UID_TENANTS && n < cap; i++) {
        if (i < SVC_UID_TENANTS)
            n += (size_t)snprintf(buf + n, cap - n, "[tenant uid-slot-%02d]\n", i);
        else
            n += (size_t)snprintf(buf + n, cap - n, "[tenant other-uids]\n");
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "max_queued_tokens = 50000\n");
    }
    return n < cap;
}

void ut_init(svc *s)
{
    for (int t = 0; t < SCHED_MAX_TENANTS; t++) {
        s->ut.slot_of[t] = -1;
        s->ut.mlabel[t] = -1;
    }
    s->ut.overflow = -1;
    if (!s->per_uid) return;
    for (int i = 0; i < SVC_UID_TENANTS; i++) {
        char name[SCHED_NAME_MAX];
        snprintf(name, sizeof name, "uid-slot-%02d", i);
        int t = sched_policy_tenant_index(s->policy, name);
        s->ut.slot[i] = (struct svc_uid_tenant){.tenant = t, .mlabel = -1};
        if (t >= 0 && t < SCHED_MAX_TENANTS) s->ut.slot_of[t] = (int8_t)i;
    }
    s->ut.overflow = sched_policy_tenant_index(s->policy, "other-uids");
}

/* The slot a new uid may take: an unbound one, else the least recently used slot whose uid
 * has no session and whose work the scheduler has released. -1 when none. */
static int ut_take(svc *s)
{
    for (int i = 0; i < SVC_UID_TENANTS; i++)
        if (!s->ut.slot[i].bound && s->ut.slot[i].tenant >= 0 &&
            sched_tenant_recycle(s->sched, s->ut.slot[i].tenant) == 0)
            return i;
    for (;;) {
        int best = -1;
        for (int i = 0; i < SVC_UID_TENANTS; i++) {
            const struct svc_uid_tenant *u = &s->ut.slot[i];
            if (u->bound && !u->sessions && !u->busy &&
                (best < 0 || u->last_us < s->ut.slot[best].last_us))
                best = i;
        }
        if (best < 0) return -1;
        if (sched_tenant_recycle(s->sched, s->ut.slot[best].tenant) == 0) return best;
        s->ut.slot[best].busy = true; /* its old work is still in the scheduler: not this time */
    }
}

int ut_acquire(svc *s, uint32_t uid)
{
    for (int i = 0; i < SVC_UID_TENANTS; i++) {
        struct svc_uid_tenant *u = &s->ut.slot[i];
        if (u->bound && u->uid == uid) {
            u->sessions++;
            u->last_us = s->now_us;
            return u->tenant;
        }
    }
    int i = ut_take(s);
    for (int k = 0; k < SVC_UID_TENANTS; k++) s->ut.slot[k].busy = false;
    if (i < 0) {
        s->ut.overflow_sessions++;
        if (s->now_us - s->ut.overflow_logged_us >= 1000000 || !s->ut.overflow_logged_us) {
            s->ut.overflow_logged_us = s->now_us ? s->now_us : 1;
            svc_log("uid %u shares tenant other-uids: all %d per-uid tenants belong to uids with "
                    "sessions or unfinished work (%llu such sessions so far)",
                    uid, SVC_UID_TENANTS, (unsigned long long)s->ut.overflow_sessions);
        }
        return s->ut.overflow;
    }
    struct svc_uid_tenant *u = &s->ut.slot[i];
    u->bound = true;
    u->uid = uid;
    u->sessions = 1;
    u->last_us = s->now_us;
    snprintf(u->label, sizeof u->label, "uid%u", uid);
    u->mlabel = -1; /* a new name: interned when first used */
    return u->tenant;
}

void ut_release(svc *s, int tenant)
{
    if (!s->per_uid || tenant < 0 || tenant >= SCHED_MAX_TENANTS) return;
    int i = s->ut.slot_of[tenant];
    if (i < 0) return;
    struct svc_uid_tenant *u = &s->ut.slot[i];
    if (u->sessions) u->sessions--;
    u->last_us = s->now_us;
}

const char *ut_label(const svc *s, int tenant)
{
    if (s->per_uid && tenant >= 0 && tenant < SCHED_MAX_TENANTS && s->ut.slot_of[tenant] >= 0) {
        const struct svc_uid_tenant *u = &s->ut.slot[s->ut.slot_of[tenant]];
        if (u->bound) return u->label;
    }
    const sched_tenant_cfg *tc = sched_policy_tenant(s->policy, tenant);
    return tc ? tc->name : "?";
}

int ut_metrics_label(svc *s, int tenant)
{
    if (tenant < 0 || tenant >= SCHED_MAX_TENANTS) return metrics_tenant_label(s->mx, "other");
    if (s->per_uid && s->ut.slot_of[tenant] >= 0) {
        struct svc_uid_tenant *u = &s->ut.slot[s->ut.slot_of[tenant]];
        if (u->bound) {
            if (u->mlabel < 0) u->mlabel = (int16_t)metrics_tenant_label(s->mx, u->label);
            return u->mlabel;
        }
    }
    if (s->ut.mlabel[tenant] < 0)
        s->ut.mlabel[tenant] = (int16_t)metrics_tenant_label(s->mx, ut_label(s, tenant));
    return s->ut.mlabel[tenant];
}

uint64_t ut_cache_salt(const svc *s, int tenant, uint32_t uid)
{
    return s->per_uid ? (1ull << 32) | uid : sched_policy_cache_salt_uid(s->policy, tenant, uid);
}
