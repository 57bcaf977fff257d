/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend's worker pool (kernels/cpu/pool.h): every task of every region runs
 * exactly once, on a worker index of the pool, and pool_run returns once they all have —
 * across many back-to-back regions whose task counts alternate between small and large.
 * That alternation is what lost the caller in the first CAS-claim pool (f32b5da): a helper
 * late on an exhausted small region read the next, larger region's task count and claimed
 * a task that belonged to no region, so done passed n_tasks and pool_run never returned
 * (here: the test's timeout). 0 and 1 tasks run inline on the caller. Tasks of a region
 * wait for flags their lower-indexed peers set, also when they must sleep for them.
 */
#include "kernels/cpu/pool.h"

#include <criterion/criterion.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#define MAX_TASKS 64

typedef struct region_check {
    int n_workers;
    _Atomic int runs[MAX_TASKS]; /* how often each task ran in the current region */
    _Atomic int bad_worker;      /* a worker index outside [0, n_workers) */
} region_check;

static void count_task(void *ctx, int task, int worker)
{
    region_check *rc = ctx;
    if (task < 0 || task >= MAX_TASKS || worker < 0 || worker >= rc->n_workers) {
        atomic_store(&rc->bad_worker, 1);
        return;
    }
    atomic_fetch_add_explicit(&rc->runs[task], 1, memory_order_relaxed);
}

static void run_regions(int n_workers, int n_regions)
{
    pool p;
    cr_assert_eq(pool_start(&p, n_workers, -1), 0, "pool_start(%d workers)", n_workers);
    static region_check rc;
    memset(&rc, 0, sizeof rc);
    rc.n_workers = n_workers;
    /* small, large, inline and empty regions, back to back */
    static const int sizes[] = {2, MAX_TASKS, 3, 1, 17, 2, 0, 4, 33, 2, MAX_TASKS};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    for (int r = 0; r < n_regions; r++) {
        const int n = sizes[r % n_sizes];
        pool_run(&p, n, count_task, &rc);
        for (int t = 0; t < MAX_TASKS; t++) {
            const int got = atomic_exchange(&rc.runs[t], 0);
            cr_assert_eq(got, t < n, "%d workers, region %d of %d tasks: task %d ran %d times",
                         n_workers, r, n, t, got);
        }
        cr_assert_eq(atomic_load(&rc.bad_worker), 0, "region %d: a worker index out of range", r);
    }
    pool_stats st;
    pool_stats_get(&p, &st, false);
    pool_stop(&p);
    if (n_workers > 1) cr_assert_gt(st.regions, 0, "parallel regions are counted");
}

/* A lost caller shows as this timeout (a run takes seconds). */
TestSuite(kernels_pool, .timeout = 120);

Test(kernels_pool, every_task_once_per_region_two_workers)
{
    run_regions(2, 100000);
}

Test(kernels_pool, every_task_once_per_region_three_workers)
{
    run_regions(3, 50000);
}

Test(kernels_pool, one_worker_runs_inline)
{
    run_regions(1, 1000);
}

/*
 * Split regions (pool_run_split): every task of every region runs exactly once, in ranges
 * that lie within the region, on a worker index of the pool, back to back with ordinary
 * regions (a helper late on one finds the other kind's words and must claim nothing from
 * them) and across sizes below, at and above the worker count.
 */
typedef struct split_check {
    int n_workers, n_tasks;
    _Atomic int runs[MAX_TASKS];
    _Atomic int bad; /* a range outside [0, n_tasks), empty, or a bad worker index */
} split_check;

static void count_range(void *ctx, int t0, int t1, int worker)
{
    split_check *sc = ctx;
    if (t0 < 0 || t1 > sc->n_tasks || t0 >= t1 || worker < 0 || worker >= sc->n_workers) {
        atomic_store(&sc->bad, 1);
        return;
    }
    for (int t = t0; t < t1; t++) atomic_fetch_add_explicit(&sc->runs[t], 1, memory_order_relaxed);
}

static void run_split_regions(int n_workers, int n_regions)
{
    pool p;
    cr_assert_eq(pool_start(&p, n_workers, -1), 0, "pool_start(%d workers)", n_workers);
    static split_check sc;
    static region_check rc;
    memset(&sc, 0, sizeof sc);
    memset(&rc, 0, sizeof rc);
    sc.n_workers = rc.n_workers = n_workers;
    static const int sizes[] = {2, MAX_TASKS, 3, 1, 17, 2, 0, 4, 33, 5, MAX_TASKS};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    for (int r = 0; r < n_regions; r++) {
        const int n = sizes[r % n_sizes];
        sc.n_tasks = n;
        pool_run_split(&p, n, count_range, &sc);
        for (int t = 0; t < MAX_TASKS; t++) {
            const int got = atomic_exchange(&sc.runs[t], 0);
            cr_assert_eq(got, t < n,
                         "%d workers, split region %d of %d tasks: task %d ran %d times", n_workers,
                         r, n, t, got);
        }
        cr_assert_eq(atomic_load(&sc.bad), 0, "split region %d of %d tasks: a bad range", r, n);
        if (r % 3 == 2) { /* an ordinary region in between */
            pool_run(&p, n, count_task, &rc);
            for (int t = 0; t < MAX_TASKS; t++)
                cr_assert_eq(atomic_exchange(&rc.runs[t], 0), t < n,
                             "%d workers, ordinary region after split %d: task %d", n_workers, r,
                             t);
        }
    }
    pool_stop(&p);
}

Test(kernels_pool, split_regions_run_every_task_once_two_workers)
{
    run_split_regions(2, 100000);
}

Test(kernels_pool, split_regions_run_every_task_once_three_and_four_workers)
{
    run_split_regions(3, 50000);
    run_split_regions(4, 20000);
}

Test(kernels_pool, split_region_on_one_worker_is_one_range)
{
    run_split_regions(1, 1000);
}

/*
 * A worker that stalls mid-region (the host descheduled it) has the rest of its share taken
 * by the others: the first range a helper runs does not return until every task outside it
 * has run. Without the taking, the caller would wait at the region's end for the helper,
 * and the helper for the caller: the deadline. A helper that shows up only after the
 * caller took everything runs nothing, which is the same outcome.
 */
#define STALL_DEADLINE_NS 20000000000ull /* 20 s: only a broken pool reaches it */
typedef struct stall_check {
    int n_tasks;
    _Atomic int ran;        /* tasks run so far */
    _Atomic int caller_ran; /* of them by the caller */
    _Atomic int stalled;    /* the helper's stalling range is running */
    _Atomic int timed_out;  /* the tasks that had run when the deadline passed, + 1 */
} stall_check;

static void stall_range(void *ctx, int t0, int t1, int worker)
{
    stall_check *sc = ctx;
    if (worker != 0 && atomic_exchange(&sc->stalled, 1) == 0) {
        const uint64_t t_start = pool_now_ns();
        while (atomic_load(&sc->ran) < sc->n_tasks - (t1 - t0)) {
            if (pool_now_ns() - t_start > STALL_DEADLINE_NS) {
                atomic_store(&sc->timed_out, 1 + atomic_load(&sc->ran));
                break;
            }
            sched_yield(); /* the CPU to the caller, should they share one */
        }
    }
    if (worker == 0) atomic_fetch_add(&sc->caller_ran, t1 - t0);
    atomic_fetch_add(&sc->ran, t1 - t0);
}

Test(kernels_pool, a_stalled_workers_share_is_taken_by_the_others)
{
    pool p;
    cr_assert_eq(pool_start(&p, 2, -1), 0);
    for (int r = 0; r < 20; r++) {
        stall_check sc = {.n_tasks = MAX_TASKS};
        pool_run_split(&p, MAX_TASKS, stall_range, &sc);
        cr_assert_eq(atomic_load(&sc.timed_out), 0,
                     "region %d: the helper stalled and its share was not taken: %d of %d tasks "
                     "ran meanwhile, %d in all on the caller",
                     r, atomic_load(&sc.timed_out) - 1, MAX_TASKS, atomic_load(&sc.caller_ran));
        cr_assert_eq(atomic_load(&sc.ran), MAX_TASKS, "region %d: %d tasks ran", r,
                     atomic_load(&sc.ran));
        /* the helper ran its stalled range at most: half its share, 16 of 64 */
        cr_assert_geq(atomic_load(&sc.caller_ran), MAX_TASKS - MAX_TASKS / 4,
                      "region %d: the caller ran %d of %d tasks", r, atomic_load(&sc.caller_ran),
                      MAX_TASKS);
    }
    pool_stop(&p);
}

/* Flags between the tasks of a region (pool_flag_set / pool_flag_wait): the first half of a
 * region's tasks each write a value and set a flag, the second half each wait for one flag
 * and read the value. The producer of the first flag may work for slow_ns first, so that
 * its waiter spins past its budget and sleeps on the flag: a lost wake shows as the
 * suite's timeout, a missing acquire as a stale value. */
#define FLAG_PAIRS 8
typedef struct flag_check {
    pool *p;
    uint64_t slow_ns;
    _Atomic uint32_t flag[FLAG_PAIRS];
    int value[FLAG_PAIRS]; /* plain: published by the flag */
    _Atomic int seen[FLAG_PAIRS];
    int round;
} flag_check;

static void flag_task(void *ctx, int task, int worker)
{
    (void)worker;
    flag_check *fc = ctx;
    if (task < FLAG_PAIRS) {
        if (task == 0 && fc->slow_ns)
            for (const uint64_t t0 = pool_now_ns(); pool_now_ns() - t0 < fc->slow_ns;)
                ; /* work that takes a while (the host descheduling a worker, made on purpose) */
        fc->value[task] = fc->round * 100 + task;
        pool_flag_set(fc->p, &fc->flag[task]);
        return;
    }
    const int i = task - FLAG_PAIRS;
    pool_flag_wait(fc->p, &fc->flag[i]);
    atomic_store_explicit(&fc->seen[i], fc->value[i], memory_order_relaxed);
}

static void run_flags(int n_workers, int n_regions, uint64_t slow_ns)
{
    pool p;
    cr_assert_eq(pool_start(&p, n_workers, -1), 0, "pool_start(%d workers)", n_workers);
    static flag_check fc;
    memset(&fc, 0, sizeof fc);
    fc.p = &p;
    fc.slow_ns = slow_ns;
    for (int r = 0; r < n_regions; r++) {
        fc.round = r;
        for (int i = 0; i < FLAG_PAIRS; i++) atomic_store(&fc.flag[i], 0);
        pool_run(&p, 2 * FLAG_PAIRS, flag_task, &fc);
        for (int i = 0; i < FLAG_PAIRS; i++)
            cr_assert_eq(atomic_load(&fc.seen[i]), r * 100 + i,
                         "%d workers, region %d: the waiter of flag %d read %d, not %d", n_workers,
                         r, i, atomic_load(&fc.seen[i]), r * 100 + i);
    }
    pool_stop(&p);
}

Test(kernels_pool, tasks_waiting_for_flags_see_what_their_setters_wrote)
{
    run_flags(1, 100, 0); /* inline, in index order: never waits */
    run_flags(2, 20000, 0);
    run_flags(3, 20000, 0);
    run_flags(2, 50, 2000000); /* 2 ms: past any spin budget, the waiters sleep */
    run_flags(3, 50, 2000000);
}

/*
 * The spin policy's choice (pool_spin_budget). A decode step at one sequence has ~30
 * regions a few µs apart and one serial gap of 130-260 µs (sampling, the next step's
 * set-up); a helper that sleeps through it costs every step a wake on the critical path,
 * so with a wake of 40 µs the budget covers that gap. An idle engine's gaps are
 * milliseconds: there a helper sleeps after a short spin.
 */
static int bucket_of(uint64_t ns)
{
    const int b = 63 - __builtin_clzll(ns);
    return b < POOL_GAP_BUCKETS ? b : POOL_GAP_BUCKETS - 1; /* the last: all longer */
}

Test(kernels_pool, spin_budget_spins_through_a_decode_steps_serial_gap)
{
    uint32_t gaps[POOL_GAP_BUCKETS] = {0};
    gaps[bucket_of(1500)] = 30 * 16; /* between a step's regions */
    gaps[bucket_of(200000)] = 16;    /* once a step */
    const uint64_t b = pool_spin_budget(gaps, 40000);
    cr_assert_geq(b, 262144, "budget %lu ns sleeps through the 200 us gap of every step",
                  (unsigned long)b);
    cr_assert_leq(b, 2u << 20, "budget %lu ns above the 2 ms cap", (unsigned long)b);
}

Test(kernels_pool, spin_budget_sleeps_soon_when_the_engine_is_idle)
{
    uint32_t gaps[POOL_GAP_BUCKETS] = {0};
    gaps[bucket_of(20000000)] = 32; /* 20 ms between steps: an idle engine */
    const uint64_t b = pool_spin_budget(gaps, 40000);
    cr_assert_leq(b, 4096, "budget %lu ns: an idle engine's helper spins on", (unsigned long)b);
    /* the same with the steps' short gaps mixed in: the long gaps still end in a sleep */
    gaps[bucket_of(1500)] = 32 * 30;
    const uint64_t b2 = pool_spin_budget(gaps, 40000);
    cr_assert_lt(b2, 20000000 / 2, "budget %lu ns spins through 20 ms gaps", (unsigned long)b2);
    cr_assert_geq(b2, 2048, "budget %lu ns sleeps between a step's regions", (unsigned long)b2);
}

/*
 * Where a region's time goes (pool_stats): the tasks' time on the caller and on the helpers
 * adds up to at least the work they did, and the caller's time in regions to at least its
 * share of it. Each task works (spins on the clock) 200 µs.
 */
#define TASK_WORK_NS 200000

static void work_task(void *ctx, int task, int worker)
{
    (void)ctx, (void)task, (void)worker;
    const uint64_t t0 = pool_now_ns();
    while (pool_now_ns() - t0 < TASK_WORK_NS) {}
}

Test(kernels_pool, region_and_task_times_account_for_the_work)
{
    enum { REGIONS = 50, TASKS = 4 };
    pool p;
    cr_assert_eq(pool_start(&p, 2, -1), 0);
    for (int r = 0; r < REGIONS; r++) pool_run(&p, TASKS, work_task, NULL);
    pool_stats st;
    pool_stats_get(&p, &st, true);
    const uint64_t work = (uint64_t)REGIONS * TASKS * TASK_WORK_NS;
    cr_assert_geq(st.caller_task_ns + st.helper_task_ns, work,
                  "tasks: caller %lu ns + helpers %lu ns, the work %lu ns",
                  (unsigned long)st.caller_task_ns, (unsigned long)st.helper_task_ns,
                  (unsigned long)work);
    cr_assert_geq(st.region_ns, st.caller_task_ns, "regions %lu ns, the caller's tasks %lu ns",
                  (unsigned long)st.region_ns, (unsigned long)st.caller_task_ns);
    cr_assert_geq(st.region_ns, work / 2, "regions %lu ns: less than half the work %lu ns",
                  (unsigned long)st.region_ns, (unsigned long)work);
    pool_stats_get(&p, &st, false);
    cr_assert(st.region_ns == 0 && st.caller_task_ns == 0 && st.helper_task_ns == 0,
              "reset: %lu %lu %lu", (unsigned long)st.region_ns, (unsigned long)st.caller_task_ns,
              (unsigned long)st.helper_task_ns);
    pool_stop(&p);
}
