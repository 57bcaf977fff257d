/* SPDX-License-Identifier: MIT */
/*
 * daemon/session_shm.c — a session's memory: its two segments, the submit-ring consumer
 * (copy once, validate, dispatch), the event-ring producer, the status words the client
 * reads, and the event pushes services make (daemon/loop.h).  The state machine is
 * session.c's.
 *
 * Segments are memfds: they have no name anywhere (nothing in /dev/shm to leak when a
 * process dies), vanish with the last fd/mapping, and can be sealed.  Both are sealed
 * against shrinking (a client could otherwise SIGBUS the daemon by truncating) and
 * growing; the daemon segment is also sealed with F_SEAL_FUTURE_WRITE after the daemon
 * mapped it, so the client cannot obtain a writable mapping of it at all.
 */
#include "daemon/session_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "numa/rnuma.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* ---- memory: the two segments -------------------------------------------------------- */

static int seg_create(const char *name, size_t bytes, int node, int future_write_seal, int *fd_out,
                      void **map_out, char *why, size_t why_len)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(why, why_len, "memfd_create: %s", strerror(errno));
        return -errno;
    }
    if (ftruncate(fd, (off_t)bytes) < 0) {
        int e = errno;
        snprintf(why, why_len, "sizing a %zu-byte segment: %s", bytes, strerror(e));
        close(fd);
        return -e;
    }
    /* Not faulted in here: a page comes (zeroed, from node) when first touched. Faulting
	 * both rings in at connect cost ~1.5 ms of the loop per session (512 pages), and as much
	 * again to free them at its end, whether or not the session ever used them; a user who
	 * connects, submits and disconnects in a loop made every other user's tokens wait for
	 * it (tests/test_daemon_security.c). A session pays one fault per 4 KiB of ring it
	 * actually uses, the first time round. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        snprintf(why, why_len, "mapping a %zu-byte segment: %s", bytes, strerror(e));
        close(fd);
        return -e;
    }
    /* Placement is an optimisation; a session still works without it. */
    if (node >= 0) (void)rnuma_bind(p, bytes, node);
    int seals =
        F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (future_write_seal ? F_SEAL_FUTURE_WRITE : 0);
    if (fcntl(fd, F_ADD_SEALS, seals) < 0) {
        int e = errno;
        snprintf(why, why_len, "sealing a segment: %s", strerror(e));
        munmap(p, bytes);
        close(fd);
        return -e;
    }
    *fd_out = fd;
    *map_out = p;
    return 0;
}

int dsess_segments_create(dsess *s, unsigned submit_bytes, unsigned event_slots, int node,
                          uint64_t policy_hash, char *why, size_t why_len)
{
    void *cp, *dp;
    int r;

    s->cseg_bytes = RINGLM_WIRE_HEADER_AREA + (size_t)submit_bytes;
    s->dseg_bytes =
        RINGLM_WIRE_HEADER_AREA + (size_t)event_slots * sizeof(struct ringlm_wire_event);
    r = seg_create("ringlm-client", s->cseg_bytes, node, 0, &s->cfd, &cp, why, why_len);
    if (r < 0) return r;
    /* The daemon segment gets F_SEAL_FUTURE_WRITE only after its header is written:
	 * the seal does not touch our existing writable mapping. */
    r = seg_create("ringlm-daemon", s->dseg_bytes, node, 1, &s->dfd, &dp, why, why_len);
    if (r < 0) goto fail_c;
    s->cseg = cp;
    s->dseg = dp;
    s->recbuf_len = submit_bytes;
    s->recbuf = aligned_alloc(64, s->recbuf_len);
    if (!s->recbuf) {
        snprintf(why, why_len, "out of memory for a %u-byte record buffer", submit_bytes);
        r = -ENOMEM;
        goto fail_d;
    }

    struct ringlm_wire_seg_header h = {
        .magic = RINGLM_WIRE_MAGIC,
        .abi = RINGLM_WIRE_ABI,
        .kind = RINGLM_WIRE_SEG_CLIENT,
        .header_bytes = sizeof(struct ringlm_wire_seg_header),
        .seg_bytes = s->cseg_bytes,
        .session_id = s->id,
        .data_off = RINGLM_WIRE_HEADER_AREA,
        .data_bytes = submit_bytes,
    };
    s->cseg->hdr = h;
    h.kind = RINGLM_WIRE_SEG_DAEMON;
    h.seg_bytes = s->dseg_bytes;
    h.data_bytes = (uint64_t)event_slots * sizeof(struct ringlm_wire_event);
    s->dseg->hdr = h;
    s->dseg->session_id = s->id;
    s->dseg->policy_hash = policy_hash;
    ring_store32(&s->dseg->state, RINGLM_WIRE_ST_ALIVE);

    /* Our view of the rings: sizes and positions come from here, never from the
	 * client-writable header. */
    s->sub = (struct ring_rec_cons){
        .data = (const uint8_t *)s->cseg + RINGLM_WIRE_HEADER_AREA,
        .cap = submit_bytes,
        .max_record = submit_bytes,
        .prod_p = &s->cseg->submit_prod,
        .cons_p = &s->dseg->submit_cons,
    };
    s->ev = (struct ring_ev_prod){
        .slots = (struct ringlm_wire_event *)((uint8_t *)s->dseg + RINGLM_WIRE_HEADER_AREA),
        .mask = event_slots - 1,
        .prod_p = &s->dseg->ev_prod,
        .cons_p = &s->cseg->ev_cons,
    };
    return 0;

fail_d:
    munmap(dp, s->dseg_bytes);
    close(s->dfd);
    s->dseg = NULL;
fail_c:
    munmap(cp, s->cseg_bytes);
    close(s->cfd);
    s->cseg = NULL;
    s->cfd = s->dfd = -1;
    return r;
}

void dsess_segments_destroy(dsess *s)
{
    free(s->recbuf);
    s->recbuf = NULL;
    if (s->dseg) {
        munmap(s->dseg, s->dseg_bytes);
        s->dseg = NULL;
    }
    if (s->cseg) {
        munmap(s->cseg, s->cseg_bytes);
        s->cseg = NULL;
    }
    if (s->cfd >= 0) close(s->cfd);
    if (s->dfd >= 0) close(s->dfd);
    s->cfd = s->dfd = -1;
}

/* ---- rings and status words ---------------------------------------------------------- */

int dsess_drain_submit(dsess *s, unsigned max_records, dsess_rec_fn fn, void *arg, char *why,
                       size_t why_len)
{
    struct ringlm_wire_parsed rec;
    unsigned taken = 0;
    uint64_t start = s->sub.cons;

    if (ring_rec_poll(&s->sub, why, why_len) < 0) return -EBADMSG;
    while (taken < max_records && !s->ending) {
        uint64_t before = s->sub.cons;
        int64_t len = ring_rec_next(&s->sub, s->recbuf, s->recbuf_len, why, why_len);
        if (len < 0) return -EBADMSG;
        if (len == 0) break;
        if (ringlm_wire_parse(s->recbuf, (size_t)len, &rec, why, why_len) < 0) return -EBADMSG;
        if (fn(arg, s, &rec) == -EAGAIN) {
            s->sub.cons = before;
            break;
        }
        taken++;
    }
    if (s->sub.cons != start) ring_rec_release(&s->sub);
    return (int)taken;
}

int dsess_submit_pending(dsess *s)
{
    return ring_load_acquire(s->sub.prod_p) != s->sub.cons;
}

int dsess_publish(dsess *s)
{
    if (!ring_ev_publish(&s->ev)) return 0;
    /* The handshake with the client's sleep (published; now its flag).  The flag is
	 * client-written: any nonzero value costs only that client a wake syscall. */
    if (ring_handshake_peer_waits(&s->cseg->client_sleeping)) {
        if (dloop_queue_futex_wake(s->loop, (const uint32_t *)&s->dseg->ev_prod) < 0)
            futex_wake((const uint32_t *)&s->dseg->ev_prod, 1, FUTEX_SCOPE_SHARED);
        return 2;
    }
    return 1;
}

int dsess_space_returned(dsess *s)
{
    char why[128];
    int64_t n = ring_ev_space(&s->ev, 2, why, sizeof(why));
    if (n < 0) {
        dsess_end(s, why);
        return 1; /* needs attention: it ends */
    }
    return n >= 2;
}

void dsess_announce_sleep(dsess *s)
{
    ring_handshake_announce(&s->dseg->daemon_sleeping);
}

void dsess_clear_sleep(dsess *s)
{
    ring_store32(&s->dseg->daemon_sleeping, 0);
}

void dsess_write_state(dsess *s, uint32_t state)
{
    if (s->dseg) ring_store32(&s->dseg->state, state);
}

void dsess_write_policy_hash(dsess *s, uint64_t hash)
{
    if (s->dseg) __atomic_store_n(&s->dseg->policy_hash, hash, __ATOMIC_RELEASE);
}

void dsess_write_load(dsess *s, const struct ringlm_wire_load *ld)
{
    if (!s->dseg) return;
    struct ringlm_wire_load *w = &s->dseg->load;
    /* seqlock: odd while writing. Each field is a release store, so a reader that sees it
     * sees the odd seq before it (no fence: ThreadSanitizer builds reject them; on x86-64
     * these are plain stores either way). */
    uint32_t seq = w->seq;
    __atomic_store_n(&w->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&w->waiting, ld->waiting, __ATOMIC_RELEASE);
    __atomic_store_n(&w->running, ld->running, __ATOMIC_RELEASE);
    __atomic_store_n(&w->kv_used, ld->kv_used, __ATOMIC_RELEASE);
    __atomic_store_n(&w->kv_total, ld->kv_total, __ATOMIC_RELEASE);
    __atomic_store_n(&w->iterations, ld->iterations, __ATOMIC_RELEASE);
    __atomic_store_n(&w->seq, seq + 2, __ATOMIC_RELEASE);
    if (!(s->dseg->caps & RINGLM_WIRE_CAP_LOAD))
        __atomic_store_n(&s->dseg->caps, s->dseg->caps | RINGLM_WIRE_CAP_LOAD, __ATOMIC_RELEASE);
}

void dsess_write_closed(dsess *s, int err, const char *reason)
{
    if (!s->dseg) return;
    ring_ev_publish(&s->ev);
    snprintf(s->dseg->end_reason, sizeof(s->dseg->end_reason), "%s", reason);
    s->dseg->end_errno = err;
    ring_store32(&s->dseg->state, RINGLM_WIRE_ST_CLOSED);
    ring_full_fence();
    futex_wake((const uint32_t *)&s->dseg->ev_prod, 1, FUTEX_SCOPE_SHARED);
}

/* ---- the service's side (daemon/loop.h) ---------------------------------------------- */

static int make_room(dsess *s, uint64_t want)
{
    char why[128];
    if (s->ending || !s->dseg) return -EPIPE;
    int64_t n = ring_ev_space(&s->ev, want, why, sizeof(why));
    if (n < 0) {
        char r[160];
        snprintf(r, sizeof(r), "hostile: %s", why);
        dsess_end(s, r);
        return -EPIPE;
    }
    if ((uint64_t)n >= want) {
        if (s->want_space) {
            s->want_space = 0;
            ring_store32(&s->dseg->want_space, 0);
        }
        return 0;
    }
    /* Full: ask the client to ring when it frees space, then look once more (the
	 * handshake: it may have consumed just before seeing the flag). */
    s->want_space = 1;
    ring_handshake_announce(&s->dseg->want_space);
    n = ring_ev_space(&s->ev, want, why, sizeof(why));
    if (n >= 0 && (uint64_t)n >= want) return 0;
    return -EAGAIN;
}

int dsess_push_event(dsess *s, const struct ringlm_wire_event *ev)
{
    int r = make_room(s, 1);
    if (r < 0) return r;
    ring_ev_put(&s->ev, ev);
    return 0;
}

int dsess_push_token(dsess *s, uint64_t req_id, int32_t token, uint32_t index)
{
    int r = make_room(s, 1);
    if (r < 0) return r;
    struct ringlm_wire_event e = {
        .req_id = req_id,
        .value = token,
        .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_TOKEN, index),
    };
    ring_ev_put(&s->ev, &e);
    return 0;
}

int dsess_push_logprobs(dsess *s, uint64_t req_id, bool prompt, int32_t token, uint32_t index,
                        const struct ringlm_wire_logprobs *lp)
{
    struct ringlm_wire_event group[RINGLM_WIRE_LP_SLOTS(RINGLM_WIRE_TOP_LOGPROBS_MAX)];
    group[0] = (struct ringlm_wire_event){
        .req_id = req_id,
        .value = token,
        .meta = RINGLM_WIRE_EV_META(prompt ? RINGLM_WIRE_EV_PROMPT : RINGLM_WIRE_EV_TOKEN, index),
    };
    unsigned n = 1 + ringlm_wire_lp_encode(lp, &group[1]);
    int r = make_room(s, n);
    if (r < 0) return r;
    for (unsigned k = 0; k < n; k++) ring_ev_put(&s->ev, &group[k]);
    return 0;
}

int dsess_push_finish(dsess *s, uint64_t req_id, unsigned reason, unsigned cause, uint32_t n_tokens,
                      uint32_t cached_tokens)
{
    return dsess_push_finish_detail(s, req_id, reason, cause, n_tokens, cached_tokens, NULL);
}

int dsess_push_finish_detail(dsess *s, uint64_t req_id, unsigned reason, unsigned cause,
                             uint32_t n_tokens, uint32_t cached_tokens, const char *detail)
{
    struct ringlm_wire_event g[2 + RINGLM_WIRE_DETAIL_SLOTS(RINGLM_WIRE_DETAIL_MAX)];
    g[0] = (struct ringlm_wire_event){
        .req_id = req_id,
        .value = (int32_t)n_tokens,
        .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_FINISH, ((reason & 0xff) << 8) | (cause & 0xff)),
    };
    g[1] = (struct ringlm_wire_event){
        .req_id = dloop_policy_hash(s->loop),
        .value = (int32_t)(uint32_t)req_id,
        .meta = RINGLM_WIRE_EV_META(RINGLM_WIRE_EV_FINISH_EXT, cached_tokens < RINGLM_WIRE_INDEX_MAX
                                                                   ? cached_tokens
                                                                   : RINGLM_WIRE_INDEX_MAX),
    };
    unsigned n = 2 + (detail ? ringlm_wire_detail_encode(req_id, detail, &g[2]) : 0);
    int r = make_room(s, n);
    if (r < 0) return r;
    for (unsigned k = 0; k < n; k++) ring_ev_put(&s->ev, &g[k]);
    return 0;
}

unsigned dsess_event_space(dsess *s)
{
    char why[128];
    if (s->ending || !s->dseg) return 0;
    int64_t n = ring_ev_space(&s->ev, s->ev.mask + 1, why, sizeof(why));
    if (n < 0) {
        char r[160];
        snprintf(r, sizeof(r), "hostile: %s", why);
        dsess_end(s, r);
        return 0;
    }
    return (unsigned)n;
}

uid_t dsess_uid(dsess *s)
{
    return s->uid;
}
gid_t dsess_gid(dsess *s)
{
    return s->gid;
}
pid_t dsess_pid(dsess *s)
{
    return s->pid;
}
uint64_t dsess_id(dsess *s)
{
    return s->id;
}
void dsess_set_user(dsess *s, void *user)
{
    s->user = user;
}
void *dsess_user(dsess *s)
{
    return s->user;
}
dloop *dsess_loop(dsess *s)
{
    return s->loop;
}
