/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/pool.h — the CPU backend's worker pool: parallel regions of independent
 * tasks, run by the calling thread (worker 0) and n_workers - 1 helper threads.
 *
 * One caller at a time: pool_run is called by one thread only (the engine's), never
 * concurrently with itself or pool_stop. The struct is public only so the backend can
 * embed it; its fields belong to pool.c.
 */
#ifndef RINGLM_KERNELS_CPU_POOL_H
#define RINGLM_KERNELS_CPU_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* One task of a region: task in [0, n_tasks), worker in [0, n_workers) (0: the caller).
 * Two tasks of one region never run on the same worker at once, so per-worker scratch
 * indexed by worker is safe. */
typedef void (*pool_task_fn)(void *ctx, int task, int worker);
/* Tasks [t0, t1) of a split region (pool_run_split), in index order, on one worker. */
typedef void (*pool_range_fn)(void *ctx, int t0, int t1, int worker);

/* A worker's share of a split region (pool_run_split), alone on its cache line: its owner
 * claims from the front, a worker that has run out takes from the back (see pool.c). */
typedef struct pool_share {
    _Alignas(64) _Atomic uint64_t word;
} pool_share;

typedef struct pool {
    int n_workers; /* including the calling thread */
    int numa_node;
    pthread_t *threads;
    pool_share *shares; /* [n_workers], for split regions */
    /* the region: written by the caller before it publishes claim, read only by a thread
     * whose claim of one of the region's tasks succeeded (see pool.c) */
    pool_task_fn fn;
    pool_range_fn range_fn; /* a split region's */
    void *ctx;
    int n_tasks;
    _Atomic bool split; /* the region runs in shares (pool_run_split); relaxed: a stale
                         * reader finds the words or claim of another generation */
    _Alignas(64) _Atomic uint32_t generation; /* futex: bumped to start a parallel region */
    _Atomic uint64_t region_ns;               /* when the caller started the latest region */
    _Atomic bool stop;
    _Alignas(64) _Atomic uint64_t claim; /* (generation << 32) | tasks not yet claimed */
    _Alignas(64) _Atomic uint32_t done;  /* futex: tasks of the region finished */
    _Atomic uint32_t helpers_asleep;     /* helpers announced asleep on generation */
    _Atomic uint32_t caller_asleep;      /* the caller announced asleep on done */
    _Atomic uint32_t flag_asleep;        /* tasks announced asleep on a flag (pool_flag_wait) */
    /* measurements (relaxed: statistics) */
    _Alignas(64) _Atomic uint64_t regions, wake_calls, waits, sleeps;
    _Atomic uint64_t budget_ns, wake_ns;    /* the helpers' latest choice and measure */
    uint64_t straggler_waits, straggler_ns; /* the caller's only (see pool_stats) */
    uint64_t region_ns_sum, caller_task_ns; /* the caller's only */
    _Atomic uint64_t helper_task_ns;
} pool;

/* The pool's counters (see eng_phase_stats for their meaning). */
typedef struct pool_stats {
    uint64_t regions, wake_calls, helper_waits, helper_sleeps;
    uint64_t spin_budget_ns, wake_latency_ns;
    /* Regions whose caller, every task claimed and its own run, still waited for a task a
     * helper was running, and the time it waited: what a helper descheduled mid-task (or
     * a slower helper) cost the engine's critical path. */
    uint64_t straggler_waits, straggler_ns;
    /* The caller's time inside parallel regions (from their start to their last task's
     * end), its time running tasks in them, and the helpers' time running tasks (summed):
     * what a second worker adds and where the rest of a region goes. */
    uint64_t region_ns, caller_task_ns, helper_task_ns;
} pool_stats;

/* Starts n_workers - 1 helper threads (none when n_workers is 1), pinned to numa_node's
 * CPUs when numa_node >= 0. Returns 0 or -errno (the threads started are stopped again). */
int pool_start(pool *p, int n_workers, int numa_node);
/* Runs fn(ctx, t, worker) for every t in [0, n_tasks) and returns when all have returned. */
void pool_run(pool *p, int n_tasks, pool_task_fn fn, void *ctx);
/* Runs every task of [0, n_tasks) once, as pool_run, in ranges fn(ctx, t0, t1, worker):
 * worker w owns the contiguous tasks [w n / n_workers, (w + 1) n / n_workers) and claims
 * them in index order, half of what is left of its share a range; a worker whose share is
 * done takes the back half of what the largest other share has not claimed yet, and claims
 * that as its own. So a worker reads contiguous tasks as one stream in a few calls, and the
 * region's end waits for the range another worker is running at most, whichever worker was
 * slower, late or descheduled. Which worker runs a task, and in which range, varies from
 * run to run: a task's result must not depend on it. Tasks may not wait for each other (no
 * pool_flag_wait). One worker, or n_tasks above POOL_SPLIT_MAX_TASKS: one range on the
 * caller. */
#define POOL_SPLIT_MAX_TASKS ((1 << 20) - 1)
void pool_run_split(pool *p, int n_tasks, pool_range_fn fn, void *ctx);
/* Flags between the tasks of one region: a task sets a flag (zeroed before the region) that
 * tasks of the same region with a higher index wait for. Tasks are claimed in index order,
 * so the setter is running or done on another worker and never waits for the waiter: the
 * wait ends. It spins as long as waking a sleeper takes, then sleeps (its setter was
 * descheduled). pool_flag_set: stores 1 and wakes the sleepers; pool_flag_wait: returns
 * once the flag is set (acquire: what the setter wrote before is visible). */
void pool_flag_set(pool *p, _Atomic uint32_t *flag);
void pool_flag_wait(pool *p, _Atomic uint32_t *flag);
/* Stops and joins the helpers. Safe on a pool that pool_start failed or never started
 * threads for (zeroed). */
void pool_stop(pool *p);
/* Reads the counters into *out (when non-NULL), then zeroes the running counts when reset. */
void pool_stats_get(pool *p, pool_stats *out, bool reset);

/* The helpers' spin policy (pool.c): given a histogram of gaps between a helper going
 * idle and the next region (bucket i: gaps in [2^i, 2^(i+1)) ns, the last one all longer)
 * and the measured wake latency of a sleeping helper, the spin budget (ns) a helper then
 * uses before it sleeps. */
#define POOL_GAP_BUCKETS 24
uint64_t pool_spin_budget(const uint32_t gaps[POOL_GAP_BUCKETS], uint64_t wake_ns);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t pool_now_ns(void);

#endif
