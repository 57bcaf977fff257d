/* SPDX-License-Identifier: MIT */
/*
 * ringlmd — the ringlm daemon.  This first version serves the echo service (--echo) for
 * transport tests and benchmarks; model serving plugs into the same loop.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/echo.h"
#include "daemon/loop.h"
#include "numa/rnuma.h"
#include "ringlm.h"

#ifndef RINGLM_VERSION
#define RINGLM_VERSION "dev"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ringlmd [options]\n"
		"  --socket PATH            listen here (default $" RINGLM_SOCKET_ENV ", else " RINGLM_DEFAULT_SOCKET ")\n"
		"  --echo                   serve the echo service (transport tests, ipc_bench)\n"
		"  --numa-node auto|N|off   pin the loop and place session memory (default auto)\n"
		"  --max-sessions N         sessions in all (default 256)\n"
		"  --max-sessions-per-uid N sessions per client uid (default 64)\n"
		"  --spin-us N              keep polling N µs after the last work before sleeping (default 50)\n"
		"  --submit-ring-bytes N    per-session submit ring, power of two (default 1048576)\n"
		"  --event-ring-slots N     per-session event ring, power of two (default 65536)\n"
		"  --doorbell futex|eventfd force the client→daemon doorbell kind (default: probe)\n"
		"  --version                print the version and exit\n"
		"  --help\n");
}

static int parse_uint(const char *opt, const char *v, unsigned long max, unsigned long *out)
{
	char *end;
	errno = 0;
	unsigned long x = strtoul(v, &end, 0);
	if (errno || !*v || *end || x > max || v[0] == '-') {
		fprintf(stderr, "ringlmd: %s '%s': expected an integer in [0, %lu]\n", opt, v, max);
		return -1;
	}
	*out = x;
	return 0;
}

/* The default socket lives in a directory that may not exist yet (/run/ringlm). */
static void make_parent_dir(const char *path)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return;
	*slash = 0;
	mkdir(dir, 0755);
}

int main(int argc, char **argv)
{
	enum { O_SOCKET = 256, O_ECHO, O_NUMA, O_MAXS, O_MAXU, O_SPIN, O_SUBMIT, O_EVSLOTS,
	       O_DOORBELL, O_VERSION, O_HELP };
	static const struct option opts[] = {
		{ "socket", required_argument, 0, O_SOCKET },
		{ "echo", no_argument, 0, O_ECHO },
		{ "numa-node", required_argument, 0, O_NUMA },
		{ "max-sessions", required_argument, 0, O_MAXS },
		{ "max-sessions-per-uid", required_argument, 0, O_MAXU },
		{ "spin-us", required_argument, 0, O_SPIN },
		{ "submit-ring-bytes", required_argument, 0, O_SUBMIT },
		{ "event-ring-slots", required_argument, 0, O_EVSLOTS },
		{ "doorbell", required_argument, 0, O_DOORBELL },
		{ "version", no_argument, 0, O_VERSION },
		{ "help", no_argument, 0, O_HELP },
		{ 0, 0, 0, 0 },
	};
	dloop_config cfg;
	dloop_config_init(&cfg);
	const char *socket_path = NULL, *numa_spec = "auto";
	int echo = 0;
	unsigned long v;

	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_SOCKET: socket_path = optarg; break;
		case O_ECHO: echo = 1; break;
		case O_NUMA: numa_spec = optarg; break;
		case O_MAXS:
			if (parse_uint("--max-sessions", optarg, 1 << 20, &v)) return 2;
			cfg.max_sessions = (int)v;
			break;
		case O_MAXU:
			if (parse_uint("--max-sessions-per-uid", optarg, 1 << 20, &v)) return 2;
			cfg.max_sessions_per_uid = (int)v;
			break;
		case O_SPIN:
			if (parse_uint("--spin-us", optarg, 60u * 1000 * 1000, &v)) return 2;
			cfg.idle_spin_us = (unsigned)v;
			break;
		case O_SUBMIT:
			if (parse_uint("--submit-ring-bytes", optarg, RINGLM_WIRE_SUBMIT_MAX, &v)) return 2;
			cfg.submit_ring_bytes = (unsigned)v;
			break;
		case O_EVSLOTS:
			if (parse_uint("--event-ring-slots", optarg, RINGLM_WIRE_EVSLOTS_MAX, &v)) return 2;
			cfg.event_ring_slots = (unsigned)v;
			break;
		case O_DOORBELL:
			if (!strcmp(optarg, "eventfd")) {
				cfg.force_eventfd = 1;
			} else if (strcmp(optarg, "futex")) {
				fprintf(stderr, "ringlmd: --doorbell '%s': expected futex or eventfd\n", optarg);
				return 2;
			}
			break;
		case O_VERSION:
			printf("ringlmd %s (wire ABI %u)\n", RINGLM_VERSION, RINGLM_WIRE_ABI);
			return 0;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ringlmd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!echo) {
		fprintf(stderr, "ringlmd: no service selected: pass --echo\n");
		return 2;
	}
	if (!socket_path || !*socket_path)
		socket_path = getenv(RINGLM_SOCKET_ENV);
	if (!socket_path || !*socket_path) {
		socket_path = RINGLM_DEFAULT_SOCKET;
		make_parent_dir(socket_path);
	}
	cfg.socket_path = socket_path;

	int node = rnuma_resolve(numa_spec);
	if (node < -1) {
		fprintf(stderr, "ringlmd: --numa-node %s: %s\n", numa_spec, rnuma_errmsg());
		return 2;
	}
	if (node >= 0 && rnuma_pin_self(node) < 0)
		fprintf(stderr, "ringlmd: pinning to node %d failed: %s (continuing unpinned)\n", node,
			rnuma_errmsg());
	cfg.numa_node = node;
	char desc[256];
	rnuma_describe(node, desc, sizeof(desc));

	echo_svc *svc;
	if (echo_create(&svc) < 0) {
		fprintf(stderr, "ringlmd: out of memory\n");
		return 1;
	}
	dloop *loop;
	int r = dloop_create(&cfg, &echo_ops, svc, &loop);
	if (r < 0) {
		fprintf(stderr, "ringlmd: %s\n", dloop_errmsg());
		echo_destroy(svc);
		return 1;
	}
	echo_attach(svc, loop);
	fprintf(stderr, "ringlmd %s: echo service on %s, doorbell %s, %s\n", RINGLM_VERSION,
		socket_path, dloop_doorbell_mode(loop), desc);
	r = dloop_run(loop);
	dloop_destroy(loop);
	fprintf(stderr, "ringlmd: stopped (%llu requests answered)\n", echo_finished(svc));
	echo_destroy(svc);
	return r < 0 ? 1 : 0;
}
