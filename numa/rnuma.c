/* SPDX-License-Identifier: MIT */
#include "numa/rnuma.h"
#include "common/errdetail.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <dirent.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

ERRDETAIL_DEFINE(rnuma_err);
#define seterr(err, ...) errdetail_set(&rnuma_err, (err), __VA_ARGS__)

const char *rnuma_errmsg(void)
{
    return rnuma_err.msg;
}

static int have_numa(void)
{
    return numa_available() >= 0;
}

int rnuma_nodes(void)
{
    if (!have_numa()) return 1;
    int n = numa_num_configured_nodes();
    return n > 0 ? n : 1;
}

/* First line of a small sysfs attribute file; 0 or -1 when it cannot be read. */
static int read_attr(const char *dev, const char *attr, char *buf, int len)
{
    char path[320];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", dev, attr);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int ok = fgets(buf, len, f) != NULL;
    fclose(f);
    return ok ? 0 : -1;
}

int rnuma_gpu_node(int gpu)
{
    /* NVIDIA devices are PCI class 0x0300/0x0302 with vendor 0x10de; take the gpu-th in
     * name order (what `ls` gave; readdir's order is unspecified). scandir, not popen("ls"):
     * the daemon calls this, and a popen forks it and runs a shell. */
    struct dirent **devs;
    int n = scandir("/sys/bus/pci/devices", &devs, NULL, alphasort);
    if (n < 0) return -ENOENT;
    int seen = 0, node = -ENOENT;
    for (int i = 0; i < n; i++) {
        const char *dev = devs[i]->d_name;
        char buf[32];
        if (dev[0] == '.') continue;
        if (read_attr(dev, "vendor", buf, sizeof buf) || strncmp(buf, "0x10de", 6) != 0) continue;
        if (read_attr(dev, "class", buf, sizeof buf) ||
            (strncmp(buf, "0x0300", 6) != 0 && strncmp(buf, "0x0302", 6) != 0))
            continue;
        if (seen++ != gpu) continue;
        int nn = -1;
        if (read_attr(dev, "numa_node", buf, sizeof buf) == 0 && sscanf(buf, "%d", &nn) == 1)
            node = nn < 0 ? 0 : nn;
        break;
    }
    for (int i = 0; i < n; i++) free(devs[i]);
    free(devs);
    return node;
}

int rnuma_resolve(const char *spec)
{
    if (!spec || strcmp(spec, "auto") == 0) {
        int g = rnuma_gpu_node(0);
        if (g >= 0) return g;
        int cpu = sched_getcpu();
        if (have_numa() && cpu >= 0) {
            int n = numa_node_of_cpu(cpu);
            if (n >= 0) return n;
        }
        return 0;
    }
    if (strcmp(spec, "off") == 0) return -1;
    char *end;
    long n = strtol(spec, &end, 10);
    if (*spec == 0 || *end != 0 || n < 0)
        return seterr(-EINVAL, "--numa-node '%s': expected auto, off or a node number", spec);
    if (n >= rnuma_nodes())
        return seterr(-EINVAL, "--numa-node %ld: this machine has %d node(s)", n, rnuma_nodes());
    return (int)n;
}

static int node_cpus(int node, cpu_set_t *set)
{
    CPU_ZERO(set);
    if (!have_numa()) {
        if (sched_getaffinity(0, sizeof *set, set) != 0) return -errno;
        return 0;
    }
    struct bitmask *bm = numa_allocate_cpumask();
    if (!bm) return -ENOMEM;
    if (numa_node_to_cpus(node, bm) != 0) {
        numa_free_cpumask(bm);
        return seterr(-EINVAL, "numa node %d has no cpus", node);
    }
    for (unsigned i = 0; i < bm->size && i < CPU_SETSIZE; i++)
        if (numa_bitmask_isbitset(bm, i)) CPU_SET(i, set);
    numa_free_cpumask(bm);
    return CPU_COUNT(set) > 0 ? 0 : seterr(-EINVAL, "numa node %d has no cpus", node);
}

int rnuma_pin_self(int node)
{
    if (node < 0) return 0;
    cpu_set_t set;
    int rc = node_cpus(node, &set);
    if (rc) return rc;
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        return seterr(-errno, "sched_setaffinity(node %d): %s", node, strerror(errno));
    return 0;
}

int rnuma_pin_self_cpu(int node, int nth)
{
    if (node < 0) return 0;
    cpu_set_t set, one;
    int rc = node_cpus(node, &set);
    if (rc) return rc;
    int count = CPU_COUNT(&set), want = nth % count, k = 0;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && k++ == want) {
            CPU_SET(c, &one);
            break;
        }
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        return seterr(-errno, "sched_setaffinity(cpu): %s", strerror(errno));
    return 0;
}

int rnuma_bind(void *p, size_t bytes, int node)
{
    if (node >= 0 && have_numa() && rnuma_nodes() > 1) {
        if (node >= (int)(sizeof(unsigned long) * 8)) /* 1UL << node would be undefined */
            return seterr(-EINVAL, "mbind(node %d): only nodes 0..%zu are supported", node,
                          sizeof(unsigned long) * 8 - 1);
        unsigned long mask = 1UL << node;
        if (mbind(p, bytes, MPOL_BIND, &mask, sizeof mask * 8, MPOL_MF_MOVE) != 0)
            return seterr(-errno, "mbind(node %d): %s", node, strerror(errno));
    }
    return 0;
}

int rnuma_place(void *p, size_t bytes, int node)
{
    int rc = rnuma_bind(p, bytes, node);
    if (rc) return rc;
    /* Fault every page in now, so the first request does not pay for it. */
    long page = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < bytes; off += (size_t)page)
        ((volatile char *)p)[off] = ((volatile char *)p)[off];
    return 0;
}

static void *alloc_placed(size_t bytes, int node, bool huge)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        seterr(-errno, "mmap %zu bytes: %s", bytes, strerror(errno));
        return NULL;
    }
    if (huge) (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: 4 KiB pages where THP is off */
    if (rnuma_place(p, bytes, node) != 0) {
        munmap(p, bytes);
        return NULL;
    }
    return p;
}

void *rnuma_alloc(size_t bytes, int node)
{
    return alloc_placed(bytes, node, false);
}

void *rnuma_alloc_huge(size_t bytes, int node)
{
    return alloc_placed(bytes, node, true);
}

void rnuma_free(void *p, size_t bytes)
{
    if (p) munmap(p, bytes);
}

void rnuma_describe(int node, char *buf, size_t len)
{
    if (node < 0) {
        snprintf(buf, len, "numa: %d node(s), pinning off", rnuma_nodes());
        return;
    }
    cpu_set_t set;
    int ncpu = node_cpus(node, &set) == 0 ? CPU_COUNT(&set) : 0;
    snprintf(buf, len, "numa: node %d of %d, %d cpu(s), loop and workers pinned there%s", node,
             rnuma_nodes(), ncpu, have_numa() ? "" : " (no NUMA support: one node)");
}

int rnuma_autogroup_nice(int pid)
{
    char path[64], buf[128];
    snprintf(path, sizeof path, "/proc/%d/autogroup", pid);
    FILE *f = fopen(path, "r");
    if (!f) return INT32_MIN;
    int nice = INT32_MIN;
    if (fgets(buf, sizeof buf, f)) {
        const char *p = strstr(buf, " nice ");
        if (p) nice = atoi(p + 6);
    }
    fclose(f);
    return nice;
}
