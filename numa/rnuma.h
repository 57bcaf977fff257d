/* SPDX-License-Identifier: MIT */
/*
 * numa/rnuma.h — topology discovery, thread pinning and node-local memory (libnuma).
 * Works on a machine with one node (or without NUMA support: everything is node 0).
 * Errors are negative errno values; rnuma_errmsg() has the detail.
 */
#ifndef RINGLM_NUMA_RNUMA_H
#define RINGLM_NUMA_RNUMA_H

#include <stddef.h>

/* Number of configured nodes (>= 1). */
int rnuma_nodes(void);
/* Node of the given GPU (0-based CUDA/NVIDIA ordinal) from sysfs, or -ENOENT. */
int rnuma_gpu_node(int gpu);
/*
 * Resolves a --numa-node argument: "off" → -1 (no pinning), "auto" → the first GPU's node
 * when sysfs names one, else the node of the CPU we run on; "N" → N if it exists.
 * Returns the node (>= 0), -1 for off, or -EINVAL with a detail.
 */
int rnuma_resolve(const char *spec);
/* Pins the calling thread to the CPUs of node (no-op for -1). 0 or -errno. */
int rnuma_pin_self(int node);
/* Pins the calling thread to one CPU (cpu index modulo the node's CPU count). */
int rnuma_pin_self_cpu(int node, int nth);
/* Memory on node (mmap + mbind; node -1 = anywhere), zero-filled and faulted in. */
void *rnuma_alloc(size_t bytes, int node);
/* The same, advised onto transparent huge pages (MADV_HUGEPAGE) before it is faulted in:
 * 2 MiB pages where the kernel's THP setting is `always` or `madvise`, else 4 KiB pages. */
void *rnuma_alloc_huge(size_t bytes, int node);
void rnuma_free(void *p, size_t bytes);
/* Binds an existing mapping (e.g. a shm segment) to node and faults it in. */
int rnuma_place(void *p, size_t bytes, int node);
/* Binds an existing mapping to node (mbind; nothing on a one-node machine) without faulting
 * it in: each page comes from node when first touched (a shared segment's policy holds for
 * every mapping of it). */
int rnuma_bind(void *p, size_t bytes, int node);
/* The nice of pid's scheduling group under autogroup scheduling (/proc/PID/autogroup:
 * "/autogroup-N nice K"), INT32_MIN where there is none (autogroup off, no /proc). With
 * autogroup a thread's nice ranks it only within its session's group. */
int rnuma_autogroup_nice(int pid);
/* One line describing what was chosen: "numa: node 0 of 1, cpus 0-1, pinned". */
void rnuma_describe(int node, char *buf, size_t len);
const char *rnuma_errmsg(void);

#endif
