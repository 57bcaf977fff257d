/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/pool.c — the worker pool of the CPU backend (pool.h): how a region's tasks
 * are claimed, how helpers wait between regions (spin, then sleep on a futex) and how
 * long they spin.
 */
#include "kernels/cpu/pool.h"
#include "numa/rnuma.h"
#include "common/futex.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * How long a helper spins before it sleeps. The pool runs a few dozen parallel regions per
 * engine step; between them the caller works alone for microseconds (norms, RoPE), and
 * between steps for as long as its own caller takes. A helper that sleeps costs the next
 * region its wake latency (a futex wake, and on a VM the exit of a halted vCPU, whose core
 * the host may have given away meanwhile); one that spins costs the CPU time it spins.
 *
 * The policy measures both and picks the budget that minimised their sum over the recent
 * past — the ski-rental choice made with the actual gap distribution:
 *   - every wait records its gap (from the helper going idle to the caller starting the
 *     next region, stamped by the caller: exact whether the helper spun or slept, so what
 *     is measured does not depend on the budget chosen) in a histogram of power-of-two
 *     buckets, halved at every re-choice (a memory of ~GAP_EPOCH waits);
 *   - every sleep measures the wake latency (region start to the helper running), averaged;
 *   - every GAP_EPOCH waits the budget becomes the power of two B in [1 µs, 2 ms] with the
 *     least  Σ_{gaps g < B} spin(g) + Σ_{gaps g >= B} (spin(B) + wake latency),
 *     where spin(t) counts the first SPIN_POLITE_NS of a spin in full and the rest at
 *     SPIN_POLITE_WEIGHT: past SPIN_POLITE_NS a spinner yields at every read of the clock,
 *     so a runnable thread waits for that CPU one round of spinning at most — what the
 *     longer spin costs others is little, while a sleep's cost is all on the engine's
 *     critical path.
 * So back-to-back steps keep the helpers spinning through every gap, and a helper of an
 * idle engine sleeps after a short spin.
 *
 * Why the weight (measured on the 2-vCPU VM, stories15M at one sequence, the engine alone
 * under SCHED_FIFO to keep other work off its CPUs): each decode step has one serial gap
 * of 130-260 µs (the caller's sampling and the next step's set-up), which the unweighted
 * cost sent the helper to sleep for, once per step (~150 sleeps in 128 steps, budget
 * 8-16 µs). The measured wake latency (30-50 µs) understates what a sleep costs there —
 * the caller's wake system call, and a vCPU resumed from halt, whose core the host may
 * have used meanwhile — the engine ran 513-555 tok/s against 589-678 with the helpers
 * forced to spin 2 ms. Weighted, the budget becomes 131-262 µs, the sleeps 28-49 a run. eng_phase_stats reports regions, waits, sleeps,
 * wake calls, the budget and the latency, so the policy's effect is measured in engine_bench.
 */
#define GAP_BUCKETS        POOL_GAP_BUCKETS /* bucket i: gaps in [2^i, 2^(i+1)) ns; the last, all longer */
#define GAP_EPOCH          32               /* waits between re-choices of the budget */
#define SPIN_MIN_LOG2      10               /* 1.0 µs */
#define SPIN_MAX_LOG2      21               /* 2.1 ms */
#define WAKE_NS_PRIOR      30000            /* wake latency assumed until one is measured */
/* Spinning past SPIN_POLITE_NS (see below), which yields the CPU at every read of the
 * clock, counts at this fraction of its length in the policy's cost. */
#define SPIN_POLITE_WEIGHT 0.125
#define SPIN_POLITE_NS     4000
/* Wake latencies count up to this: a longer one is a run queue's wait on an oversubscribed
 * machine, which a spinning helper would not have avoided (it waits for a CPU too). */
#define WAKE_NS_CAP        500000

typedef struct spin_policy {
    uint32_t gaps[GAP_BUCKETS];
    int waits; /* since the last re-choice */
    uint64_t budget_ns;
    uint64_t wake_ns; /* moving average of measured wake latencies */
} spin_policy;

static int log2_bucket(uint64_t ns)
{
    int b = ns ? 63 - __builtin_clzll(ns) : 0;
    return b < GAP_BUCKETS ? b : GAP_BUCKETS - 1;
}

static void spin_policy_init(spin_policy *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->budget_ns = 50000;
    sp->wake_ns = WAKE_NS_PRIOR;
}

/* What spinning for ns costs in the policy's sum (see SPIN_POLITE_WEIGHT). */
static double spin_cost(double ns)
{
    return ns <= SPIN_POLITE_NS ? ns : SPIN_POLITE_NS + (ns - SPIN_POLITE_NS) * SPIN_POLITE_WEIGHT;
}

uint64_t pool_spin_budget(const uint32_t gaps[POOL_GAP_BUCKETS], uint64_t wake_ns)
{
    double best = -1;
    uint64_t choice = 1ull << SPIN_MIN_LOG2;
    for (int j = SPIN_MIN_LOG2; j <= SPIN_MAX_LOG2; j++) {
        const double budget = (double)(1ull << j);
        double cost = 0;
        for (int i = 0; i < GAP_BUCKETS; i++) {
            const double gap = 1.5 * (double)(1ull << i); /* the bucket's middle */
            cost += gaps[i] * (i < j ? spin_cost(gap) : spin_cost(budget) + (double)wake_ns);
        }
        if (best < 0 || cost < best) {
            best = cost;
            choice = 1ull << j;
        }
    }
    return choice;
}

static void spin_policy_choose(spin_policy *sp)
{
    sp->budget_ns = pool_spin_budget(sp->gaps, sp->wake_ns);
    for (int i = 0; i < GAP_BUCKETS; i++) sp->gaps[i] /= 2;
    sp->waits = 0;
}

/* One wait of a helper: its gap, and its wake latency if it slept. */
static void spin_policy_record(spin_policy *sp, uint64_t gap_ns, bool slept, uint64_t wake_ns)
{
    sp->gaps[log2_bucket(gap_ns)]++;
    if (slept)
        sp->wake_ns +=
            ((int64_t)(wake_ns < WAKE_NS_CAP ? wake_ns : WAKE_NS_CAP) - (int64_t)sp->wake_ns) / 8;
    if (++sp->waits == GAP_EPOCH) spin_policy_choose(sp);
}


/*
 * Claiming tasks. A region's tasks are claimed from one word,
 *
 *   claim = (generation << 32) | tasks of that region not yet claimed,
 *
 * by compare-and-swap that lowers the count by one; the claimer runs task
 * n_tasks - (count before). A thread claims only for the region it woke for (its
 * generation), so a helper that arrives late — descheduled: the cores are shared — finds
 * the count at zero or the word naming a later region, and goes back to waiting; the
 * caller, which claims too, waits only for tasks still running (done == n_tasks), never
 * for a helper to show up.
 *
 * Everything a claim needs to decide is in the word itself. (The first version of this
 * scheme, f32b5da, kept the next task's index in the word and compared it with n_tasks
 * read from the struct. A helper holding an exhausted word of region g, (g, n_g), could
 * read n_tasks already rewritten by the caller for region g+1 — the caller writes the
 * region's fields before it publishes the new word — find n_g < n_{g+1} and win its CAS
 * against the stale word (g, n_g) before the caller's store of (g+1, 0) landed; it then
 * ran a task that was no one's, with a mix of the two regions' fn and ctx, and counted it
 * in done after the caller had reset done for g+1: done reached n_tasks + 1, the caller's
 * done == n_tasks never held, and it slept forever — seen in gdb as done=5 in a 4-task
 * region with every helper idle.) A count of zero cannot be claimed, and within a
 * generation the count only falls, so a CAS that succeeds against (g, r) with r > 0 took a
 * task of region g while region g was still open: no ABA short of the 32-bit generation
 * wrapping while one helper is stalled between its load and its CAS.
 *
 * fn, ctx and n_tasks are plain fields: the caller writes them before its release store of
 * the word, and a thread reads them only after its claim succeeded (acquire: every CAS
 * continues the release sequence of that store), so it reads this region's values; the
 * caller does not write the next region's until done == n_tasks, which needs this task's
 * done increment, made after those reads. A thread whose claim fails reads nothing else.
 */

typedef struct worker_arg {
    pool *p;
    int index;
} worker_arg;

/*
 * The sleep/wake handshake, named once (both waits of the pool use it). A waiter that has
 * spun long enough announces itself in *asleep, re-reads the word and sleeps only if it is
 * unchanged; a waker changes the word (a sequentially consistent read-modify-write or
 * store), then makes the wake system call only if someone announced. All four operations
 * are seq_cst, so of (announce, re-read) and (change, read the announcements) the pair
 * that comes second in their single total order sees the other's first: either the waiter
 * sees the change and does not sleep, or the waker sees the announcement and wakes it
 * (FUTEX_WAIT returns at once if the word changed between the re-read and the sleep). A
 * waker whose peers are spinning makes no system call.
 */
static bool sleep_unless_changed(_Atomic uint32_t *word, uint32_t seen, _Atomic uint32_t *asleep)
{
    bool slept = false;
    atomic_fetch_add_explicit(asleep, 1, memory_order_seq_cst);
    if (atomic_load_explicit(word, memory_order_seq_cst) == seen) {
        futex_wait((const uint32_t *)word, seen, -1, FUTEX_SCOPE_PROCESS);
        slept = true;
    }
    atomic_fetch_sub_explicit(asleep, 1, memory_order_relaxed);
    return slept;
}

/* The waker's half, after its seq_cst change of *word: true when it made the wake call. */
static bool wake_if_asleep(_Atomic uint32_t *word, _Atomic uint32_t *asleep)
{
    if (atomic_load_explicit(asleep, memory_order_seq_cst) == 0) return false;
    futex_wake((const uint32_t *)word, INT32_MAX, FUTEX_SCOPE_PROCESS);
    return true;
}

/* The spin-wait hint: PAUSE on x86, YIELD on arm64, nothing elsewhere. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* Spin iterations between two reads of the clock while waiting. */
#define SPINS_PER_CLOCK 64
/* Past SPIN_POLITE_NS of spinning a helper also yields at each read of the clock: on an
 * idle CPU sched_yield returns at once (the vCPU stays busy, which is the point of
 * spinning), on an oversubscribed one it lets a runnable thread — often this engine's
 * caller — have the CPU the spin would burn. */

/* Claims and runs tasks of region gen until none is left unclaimed; returns the time spent
 * running them. */
static uint64_t run_tasks(pool *p, uint32_t gen, int worker)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire), busy_ns = 0;
    for (;;) {
        const uint32_t left = (uint32_t)c;
        if ((uint32_t)(c >> 32) != gen || left == 0) return busy_ns;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c - 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* c now holds the word's current value */
        /* claimed: the region is still open, so these are its own (see above); in index
         * order, which pool_flag_wait relies on */
        const uint64_t t0 = pool_now_ns();
        p->fn(p->ctx, p->n_tasks - (int)left, worker);
        const uint64_t task_ns = pool_now_ns() - t0;
        busy_ns += task_ns;
        /* a helper's before its done count: the caller's read after the region sees it */
        if (worker) atomic_fetch_add_explicit(&p->helper_task_ns, task_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_seq_cst);
        if (wake_if_asleep(&p->done, &p->caller_asleep))
            atomic_fetch_add_explicit(&p->wake_calls, 1, memory_order_relaxed);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

/*
 * Split regions (pool_run_split). Each worker's share of the tasks is one word on its own
 * cache line,
 *
 *   word = (generation mod 2^24) << 40 | next << 20 | end,
 *
 * the tasks [next, end) of the share not yet claimed. Its owner claims from the front by a
 * CAS that raises next: half of what is left (at least one task), run as one contiguous
 * range, so a share takes a few calls, the last ones small. The CAS is uncontended while
 * no one else is out of work (the line stays in the owner's cache). A worker that has run
 * out lowers the end of the largest other share by half of its claimable tasks (at least
 * one), and installs what it took, [end - k, end), as its own share, where others may take
 * from it in turn. Claims and thefts CAS the whole word, so the same task cannot be both
 * claimed and taken.
 *
 * Why the word carries the generation: the caller writes the words of region g+1 once every
 * task of region g has run, while a worker that ran out in region g may still be loading
 * words to steal from. Tagged, it finds them another generation's and stops; and every CAS
 * compares the tag, so none succeeds across regions (an ABA needs 2^24 regions to pass
 * between one worker's load and its CAS). Within a region a word never takes the same value
 * twice: a non-empty word's next is a task not yet claimed, and it stays so while end only
 * falls, until that task is claimed or taken.
 *
 * A worker installs a theft in its own word by a CAS from the empty value it last read: no
 * one else writes an empty word, and the region (whose tasks it just took) is still open,
 * so the caller has not rewritten it; should it fail anyway, the worker runs what it took
 * there and then. fn and ctx are read only after a claim or theft succeeded against a word
 * of this region, as in run_tasks (a helper reaches the words through its acquire of the
 * generation the caller stored after them; the caller writes the next region's fields only
 * after this region's done count, which every worker adds to after its last task). Each
 * worker adds the tasks it ran to done once, when it finds nothing left to claim or take:
 * the caller waits for done == n_tasks.
 */
#define SPLIT_TASK_BITS 20
#define SPLIT_TASK_MASK ((1ull << SPLIT_TASK_BITS) - 1)
#define SPLIT_TAG_SHIFT (2 * SPLIT_TASK_BITS)
#define SPLIT_TAG_MASK  ((1ull << 24) - 1)

static inline uint64_t split_word(uint32_t gen, uint32_t next, uint32_t end)
{
    return (gen & SPLIT_TAG_MASK) << SPLIT_TAG_SHIFT | (uint64_t)next << SPLIT_TASK_BITS | end;
}
static inline bool split_tagged(uint64_t w, uint32_t gen)
{
    return w >> SPLIT_TAG_SHIFT == (gen & SPLIT_TAG_MASK);
}
static inline uint32_t split_next(uint64_t w)
{
    return (uint32_t)(w >> SPLIT_TASK_BITS & SPLIT_TASK_MASK);
}
static inline uint32_t split_end(uint64_t w)
{
    return (uint32_t)(w & SPLIT_TASK_MASK);
}

/* Takes the back half of the claimable tasks of the largest other share of region gen:
 * true with [*t0, *t1) taken, false when every other share is empty (or another region's). */
static bool split_steal(pool *p, uint32_t gen, int worker, uint32_t *t0, uint32_t *t1)
{
    for (;;) {
        int victim = -1;
        uint64_t vw = 0;
        uint32_t most = 0;
        for (int i = 1; i < p->n_workers; i++) {
            const int v = (worker + i) % p->n_workers;
            const uint64_t w = atomic_load_explicit(&p->shares[v].word, memory_order_relaxed);
            if (!split_tagged(w, gen) || split_end(w) <= split_next(w)) continue;
            if (split_end(w) - split_next(w) > most) {
                most = split_end(w) - split_next(w);
                victim = v;
                vw = w;
            }
        }
        if (victim < 0) return false;
        const uint32_t next = split_next(vw), end = split_end(vw), k = (end - next + 1) / 2;
        if (atomic_compare_exchange_strong_explicit(&p->shares[victim].word, &vw,
                                                    split_word(gen, next, end - k),
                                                    memory_order_acquire, memory_order_relaxed)) {
            *t0 = end - k;
            *t1 = end;
            return true;
        }
        /* the owner claimed, or another worker took: look again */
    }
}

/* Claims and runs tasks of split region gen, its own share first, then what it takes from
 * the others, until none is left; adds the count it ran to done. Returns the time from its
 * start to its last task's end. */
static uint64_t run_split(pool *p, uint32_t gen, int worker)
{
    _Atomic uint64_t *own = &p->shares[worker].word;
    const uint64_t t_start = pool_now_ns();
    uint32_t ran = 0;
    uint64_t w = atomic_load_explicit(own, memory_order_acquire);
    for (;;) {
        if (!split_tagged(w, gen)) break; /* a later region's word: this one is over */
        const uint32_t next = split_next(w), end = split_end(w);
        if (next < end) {
            const uint32_t take = (end - next + 1) / 2;
            if (!atomic_compare_exchange_weak_explicit(own, &w,
                                                       w + ((uint64_t)take << SPLIT_TASK_BITS),
                                                       memory_order_acquire, memory_order_acquire))
                continue; /* w holds the word's current value: a thief took from the end */
            p->range_fn(p->ctx, (int)next, (int)(next + take), worker);
            ran += take;
            w = atomic_load_explicit(own, memory_order_acquire);
            continue;
        }
        uint32_t t0, t1;
        if (!split_steal(p, gen, worker, &t0, &t1)) break;
        if (!atomic_compare_exchange_strong_explicit(own, &w, split_word(gen, t0, t1),
                                                     memory_order_release, memory_order_relaxed)) {
            p->range_fn(p->ctx, (int)t0, (int)t1, worker); /* see above */
            ran += t1 - t0;
        }
        w = atomic_load_explicit(own, memory_order_acquire);
    }
    const uint64_t busy_ns = pool_now_ns() - t_start;
    if (ran) {
        if (worker) atomic_fetch_add_explicit(&p->helper_task_ns, busy_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->done, ran, memory_order_seq_cst);
        if (wake_if_asleep(&p->done, &p->caller_asleep))
            atomic_fetch_add_explicit(&p->wake_calls, 1, memory_order_relaxed);
    }
    return busy_ns;
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    pool *p = wa->p;
    int index = wa->index;
    free(wa);
    if (p->numa_node >= 0) rnuma_pin_self_cpu(p->numa_node, index);
    spin_policy sp;
    spin_policy_init(&sp);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        const uint64_t idle_since = pool_now_ns();
        bool slept = false;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins % SPINS_PER_CLOCK) {
                cpu_relax();
                continue;
            }
            const uint64_t spun = pool_now_ns() - idle_since;
            if (spun >= sp.budget_ns)
                slept |= sleep_unless_changed(&p->generation, seen, &p->helpers_asleep);
            else if (spun >= SPIN_POLITE_NS)
                sched_yield();
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        /* region_ns was stored before the generation's release: this region's or later */
        const uint64_t start = atomic_load_explicit(&p->region_ns, memory_order_relaxed);
        const uint64_t now = pool_now_ns();
        spin_policy_record(&sp, start > idle_since ? start - idle_since : 0, slept,
                           slept && now > start ? now - start : 0);
        atomic_fetch_add_explicit(&p->waits, 1, memory_order_relaxed);
        if (slept) atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
        atomic_store_explicit(&p->budget_ns, sp.budget_ns, memory_order_relaxed);
        atomic_store_explicit(&p->wake_ns, sp.wake_ns, memory_order_relaxed);
        /* a stale reading (the caller already on a later region) finds that region's claim
         * word or share words tagged with another generation in either mode: it claims
         * nothing */
        if (atomic_load_explicit(&p->split, memory_order_relaxed))
            run_split(p, g, index);
        else
            run_tasks(p, g, index);
    }
}

/* Publishes region gen (its fields written, its claim or share words stored: the seq_cst
 * store releases them) and wakes the helpers that sleep. */
static void region_publish(pool *p, uint32_t gen)
{
    atomic_store_explicit(&p->generation, gen, memory_order_seq_cst);
    atomic_fetch_add_explicit(&p->regions, 1, memory_order_relaxed);
    if (wake_if_asleep(&p->generation, &p->helpers_asleep))
        atomic_fetch_add_explicit(&p->wake_calls, 1, memory_order_relaxed);
}

static void region_wait(pool *p, int n_tasks, uint64_t region0);

void pool_run(pool *p, int n_tasks, pool_task_fn fn, void *ctx)
{
    if (p->n_workers == 1 || n_tasks <= 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    const uint64_t region0 = pool_now_ns();
    const uint32_t gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->split, false, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->region_ns, region0, memory_order_relaxed);
    /* publishes the fields above to whoever claims (release) */
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32 | (uint32_t)n_tasks, memory_order_release);
    region_publish(p, gen);
    p->caller_task_ns += run_tasks(p, gen, 0);
    region_wait(p, n_tasks, region0);
}

void pool_run_split(pool *p, int n_tasks, pool_range_fn fn, void *ctx)
{
    if (p->n_workers == 1 || n_tasks <= 1 || n_tasks > POOL_SPLIT_MAX_TASKS || !p->shares) {
        if (n_tasks > 0) fn(ctx, 0, n_tasks, 0);
        return;
    }
    const uint64_t region0 = pool_now_ns();
    const uint32_t gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    p->range_fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->split, true, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->region_ns, region0, memory_order_relaxed);
    const int nw = p->n_workers;
    for (int w = 0; w < nw; w++)
        atomic_store_explicit(&p->shares[w].word,
                              split_word(gen, (uint32_t)((int64_t)w * n_tasks / nw),
                                         (uint32_t)((int64_t)(w + 1) * n_tasks / nw)),
                              memory_order_relaxed);
    region_publish(p, gen);
    p->caller_task_ns += run_split(p, gen, 0);
    region_wait(p, n_tasks, region0);
}

/* The caller's end of a region, its own tasks run: returns once done == n_tasks. */
static void region_wait(pool *p, int n_tasks, uint64_t region0)
{
    /* Every task is claimed; the ones helpers run end within microseconds unless a helper
     * was descheduled mid-task: spin for twice what waking a sleeper measured (the
     * ski-rental bound), then sleep. */
    if (atomic_load_explicit(&p->done, memory_order_acquire) == (uint32_t)n_tasks) {
        p->region_ns_sum += pool_now_ns() - region0;
        return;
    }
    const uint64_t budget = 2 * atomic_load_explicit(&p->wake_ns, memory_order_relaxed);
    const uint64_t t0 = pool_now_ns();
    uint32_t d;
    int spins = 0;
    while ((d = atomic_load_explicit(&p->done, memory_order_acquire)) != (uint32_t)n_tasks) {
        if (++spins % SPINS_PER_CLOCK || pool_now_ns() - t0 < budget)
            cpu_relax();
        else
            sleep_unless_changed(&p->done, d, &p->caller_asleep);
    }
    const uint64_t end = pool_now_ns();
    p->straggler_waits++;
    p->straggler_ns += end - t0;
    p->region_ns_sum += end - region0;
}

void pool_flag_set(pool *p, _Atomic uint32_t *flag)
{
    atomic_store_explicit(flag, 1, memory_order_seq_cst);
    wake_if_asleep(flag, &p->flag_asleep);
}

/* Spins as the caller waits for a region's last task (twice the measured wake latency),
 * then sleeps: the task it waits for is on a worker the host descheduled, and a spinning
 * (or yielding) thread keeps the CPU that worker could have run on. */
void pool_flag_wait(pool *p, _Atomic uint32_t *flag)
{
    if (atomic_load_explicit(flag, memory_order_acquire)) return;
    const uint64_t budget = 2 * atomic_load_explicit(&p->wake_ns, memory_order_relaxed);
    const uint64_t t0 = pool_now_ns();
    int spins = 0;
    while (!atomic_load_explicit(flag, memory_order_acquire)) {
        if (++spins % SPINS_PER_CLOCK || pool_now_ns() - t0 < budget)
            cpu_relax();
        else
            sleep_unless_changed(flag, 0, &p->flag_asleep);
    }
}

int pool_start(pool *p, int n_workers, int numa_node)
{
    memset(p, 0, sizeof *p);
    p->n_workers = n_workers;
    p->numa_node = numa_node;
    p->budget_ns = 50000;
    p->wake_ns = WAKE_NS_PRIOR;
    if (n_workers == 1) return 0;
    p->threads = calloc((size_t)n_workers, sizeof *p->threads);
    p->shares = aligned_alloc(64, (size_t)n_workers * sizeof *p->shares);
    if (!p->threads || !p->shares) {
        free(p->threads);
        free(p->shares);
        p->threads = NULL;
        p->shares = NULL;
        return -ENOMEM;
    }
    for (int i = 0; i < n_workers; i++) atomic_init(&p->shares[i].word, 0);
    for (int i = 1; i < n_workers; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int err = wa ? 0 : ENOMEM;
        if (wa) {
            *wa = (worker_arg){p, i};
            err = pthread_create(&p->threads[i], NULL, worker_main, wa);
            if (err) free(wa);
        }
        if (err) {
            p->n_workers = i; /* stop the ones already running */
            pool_stop(p);
            return -err;
        }
    }
    return 0;
}

void pool_stop(pool *p)
{
    if (!p->threads) return;
    atomic_store_explicit(&p->stop, true, memory_order_release);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_seq_cst);
    futex_wake((const uint32_t *)&p->generation, INT32_MAX, FUTEX_SCOPE_PROCESS);
    for (int i = 1; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    p->threads = NULL;
    free(p->shares);
    p->shares = NULL;
}

void pool_stats_get(pool *p, pool_stats *out, bool reset)
{
    if (out) {
        out->regions = atomic_load_explicit(&p->regions, memory_order_relaxed);
        out->wake_calls = atomic_load_explicit(&p->wake_calls, memory_order_relaxed);
        out->helper_waits = atomic_load_explicit(&p->waits, memory_order_relaxed);
        out->helper_sleeps = atomic_load_explicit(&p->sleeps, memory_order_relaxed);
        out->spin_budget_ns = atomic_load_explicit(&p->budget_ns, memory_order_relaxed);
        out->wake_latency_ns = atomic_load_explicit(&p->wake_ns, memory_order_relaxed);
        out->straggler_waits = p->straggler_waits;
        out->straggler_ns = p->straggler_ns;
        out->region_ns = p->region_ns_sum;
        out->caller_task_ns = p->caller_task_ns;
        out->helper_task_ns = atomic_load_explicit(&p->helper_task_ns, memory_order_relaxed);
    }
    if (reset) {
        atomic_store_explicit(&p->regions, 0, memory_order_relaxed);
        atomic_store_explicit(&p->wake_calls, 0, memory_order_relaxed);
        atomic_store_explicit(&p->waits, 0, memory_order_relaxed);
        atomic_store_explicit(&p->sleeps, 0, memory_order_relaxed);
        p->straggler_waits = p->straggler_ns = 0;
        p->region_ns_sum = p->caller_task_ns = 0;
        atomic_store_explicit(&p->helper_task_ns, 0, memory_order_relaxed);
    }
}
