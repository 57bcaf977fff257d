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
