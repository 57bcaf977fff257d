/* SPDX-License-Identifier: MIT */
/*
 * prefix_bench — what the prefix cache buys on a real ringlmd, cache on against cache off in
 * one run (DESIGN §10, issue "prefix caching").
 *
 * Workload "shared-prefix", closed loop: --concurrency conversations at a time, --conversations
 * in all.  A conversation is a system prompt (one of --system-prompts, --system-len tokens,
 * shared by every conversation that picks it) followed by 1..--turns turns; each turn's prompt
 * is the previous prompt + the answer the daemon gave + a new user message (8..24 tokens); a
 * fraction --one-off of conversations is one unique prompt instead.  The same seed gives the
 * same prompts to both daemons (greedy: the answers are equal too).  A second workload with
 * no shared prefixes at all (every prompt unique, the same lengths) measures what the cache
 * costs when it cannot help.
 *
 * Each phase starts its own ringlmd (cache on, or --no-prefix-cache) from the build's bin/,
 * runs the workload, reads the daemon's /metrics, stops it.  Phases alternate off/on
 * --rounds times; figures are medians over rounds.
 *
 *   ttft_p50_ms       {on, off}: median over requests of submit → first token (median of rounds)
 *   prefill_tokens    {on, off}: prompt tokens the engine computed = ringlm_iteration_tokens_total
 *                     − decode rows (Σ(generated − 1)); recompute included
 *   hit_rate          vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (on)
 *   nosharing_throughput_ratio  generated tokens per second on / off, no-sharing workload
 *   goals             ttft_ratio >= 3, prefill_saved >= 0.70, nosharing ratio >= 0.97
 *
 * usage: prefix_bench [--json] [--rounds N] [--conversations N] [--concurrency N]
 *                     [--turns N] [--system-prompts N] [--system-len N] [--one-off F]
 *                     [--model PATH] [--bin DIR] [--seed N]
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perf/bench_util.h"
#include "ringlm.h"

#define VOCAB 512
#define MAX_CTX 480   /* stories260K's context is 512: leave room for the answer */

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000;
}

static pid_t daemon_pid = -1;
static char dir[64];

static void stop_daemon(void)
{
	if (daemon_pid <= 0) return;
	kill(daemon_pid, SIGTERM);
	for (int i = 0; i < 1500; i++) {
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) { daemon_pid = -1; return; }
		usleep(10000);
	}
	kill(daemon_pid, SIGKILL);
	waitpid(daemon_pid, NULL, 0);
	daemon_pid = -1;
}

static void cleanup(void)
{
	stop_daemon();
	if (dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
		if (system(cmd)) {}
	}
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("prefix_bench: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	cleanup();
	exit(1);
}

static int metrics_port;

static void start_daemon(const char *bin, const char *model, bool cache, const char *sock)
{
	char ringlmd[600], log[128];
	snprintf(ringlmd, sizeof ringlmd, "%s/ringlmd", bin);
	static int phase;
	snprintf(log, sizeof log, "%s/ringlmd-%d-%s.log", dir, ++phase, cache ? "on" : "off");   /* never an old one's port */
	unlink(sock);
	char *argv[] = {ringlmd, "--socket", (char *)sock, "--numa-node", "off", "--model", (char *)model,
			"--metrics", "127.0.0.1:0", cache ? NULL : "--no-prefix-cache", NULL};
	pid_t pid = fork();
	if (pid < 0) die("fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], argv);
		_exit(127);
	}
	daemon_pid = pid;
	metrics_port = 0;
	for (int i = 0; i < 3000 && !metrics_port; i++) {
		if (waitpid(pid, NULL, WNOHANG) == pid) { daemon_pid = -1; die("ringlmd exited at start (see %s)", log); }
		FILE *f = fopen(log, "r");
		char line[512];
		while (f && fgets(line, sizeof line, f))
			if (sscanf(line, "ringlmd: metrics on port %d", &metrics_port) == 1) break;
		if (f) fclose(f);
		if (!metrics_port) usleep(10000);
	}
	if (!metrics_port) die("ringlmd did not start (%s)", log);
	for (int i = 0; i < 3000 && access(sock, F_OK) != 0; i++) usleep(10000);
}

static char *http_get(const char *path)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)metrics_port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("metrics connect: %s", strerror(errno));
	char req[128];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n", path);
	if (write(fd, req, (size_t)n) != n) die("metrics write");
	size_t cap = 1 << 16, len = 0;
	char *b = malloc(cap);
	ssize_t r;
	while (b && (r = read(fd, b + len, cap - len - 1)) > 0) {
		len += (size_t)r;
		if (len + 1024 > cap) b = realloc(b, cap *= 2);
	}
	if (!b) die("out of memory");
	b[len] = 0;
	close(fd);
	return b;
}

static double metric(const char *text, const char *name)
{
	size_t l = strlen(name);
	for (const char *p = strstr(text, name); p; p = strstr(p + 1, name))
		if ((p == text || p[-1] == '\n') && (p[l] == ' ' || p[l] == '{')) {
			const char *v = p[l] == '{' ? strchr(p, '}') : p + l;
			return v ? strtod(v + 1, NULL) : 0;
		}
	return 0;
}

/* ---- the workload ---------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}
static int32_t tok(void) { return (int32_t)(3 + rnd() % (VOCAB - 3)); }

typedef struct conv {
	int32_t  p[MAX_CTX + 64];
	uint32_t n;            /* prompt so far */
	int      turns, turn;
	uint64_t req, t0;
	bool     got_first, active;
	uint64_t seed;
} conv;

typedef struct cfg {
	int conversations, concurrency, turns, system_prompts, system_len, max_new;
	double one_off;
	uint64_t seed;
} cfg;

typedef struct result {
	double ttft_p50_ms, tokens_per_s, prefill_tokens, hit_rate, prompt_tokens;
	uint64_t requests, generated;
} result;

/* Sets up conversation i: its system prompt (or a unique one), its turn count. */
static void conv_init(const cfg *c, conv *v, int i, bool sharing)
{
	memset(v, 0, sizeof *v);
	rng_state = c->seed * 1000003u + (uint64_t)i;
	bool single = !sharing || (double)(rnd() % 10000) / 10000.0 < c->one_off;
	v->turns = single ? 1 : 1 + (int)(rnd() % (uint64_t)c->turns);
	uint64_t sys = rnd() % (uint64_t)c->system_prompts;
	if (single) {
		for (int k = 0; k < c->system_len; k++) v->p[v->n++] = tok();
	} else {
		uint64_t save = rng_state;
		rng_state = 0xabcdef12345ull + sys * 7919u;
		for (int k = 0; k < c->system_len; k++) v->p[v->n++] = tok();
		rng_state = save;
	}
	v->seed = rng_state;
	v->active = true;
}

/* Appends the next user message; false when the context is full (the conversation ends). */
static bool conv_next_turn(conv *v)
{
	rng_state = v->seed;
	uint32_t nu = 8 + (uint32_t)(rnd() % 17);
	if (v->n + nu + 40 > MAX_CTX) return false;
	for (uint32_t k = 0; k < nu; k++) v->p[v->n++] = tok();
	v->seed = rng_state;
	return true;
}

static void submit(ringlm_client *cl, const cfg *c, conv *v)
{
	ringlm_request r;
	ringlm_request_init(&r);
	r.prompt = v->p;
	r.n_prompt = v->n;
	r.max_new_tokens = (uint32_t)c->max_new;
	int rc;
	while ((rc = ringlm_submit(cl, &r, &v->req)) == -EAGAIN) usleep(100);
	if (rc < 0) die("submit: %s %s", ringlm_strerror(rc), ringlm_errdetail());
	v->t0 = now_us();
	v->got_first = false;
}

static int cmp_d(const void *a, const void *b) { return bench_cmp_double(a, b); }

static result run_phase(const char *bin, const char *model, const cfg *c, bool cache, bool sharing)
{
	char sock[128];
	snprintf(sock, sizeof sock, "%s/s.sock", dir);
	start_daemon(bin, model, cache, sock);
	ringlm_client *cl;
	int rc = ringlm_connect(sock, &cl);
	if (rc < 0) die("connect: %s %s", ringlm_strerror(rc), ringlm_errdetail());
	conv *cv = calloc((size_t)c->concurrency, sizeof *cv);
	size_t cap_t = (size_t)c->conversations * (size_t)(c->turns + 1), nt = 0;
	double *ttft = malloc(cap_t * sizeof *ttft);
	if (!cv || !ttft) die("out of memory");
	int started = 0, done = 0;
	uint64_t generated = 0, decode_rows = 0, prompt_tokens = 0, t_start = now_us();
	for (int s = 0; s < c->concurrency && started < c->conversations; s++) {
		conv_init(c, &cv[s], started++, sharing);
		conv_next_turn(&cv[s]);
		prompt_tokens += cv[s].n;
		submit(cl, c, &cv[s]);
	}
	while (done < c->conversations) {
		ringlm_event ev;
		rc = ringlm_next_event(cl, &ev, 60000);
		if (rc <= 0) die("next_event: %s %s", rc ? ringlm_strerror(rc) : "timeout", ringlm_errdetail());
		int s = 0;
		while (s < c->concurrency && !(cv[s].active && cv[s].req == ev.req_id)) s++;
		if (s == c->concurrency) continue;
		conv *v = &cv[s];
		if (ev.kind == RINGLM_EV_TOKEN) {
			if (!v->got_first) {
				v->got_first = true;
				if (nt < cap_t) ttft[nt++] = (double)(now_us() - v->t0) / 1000.0;
			}
			if (v->n < MAX_CTX + 60) v->p[v->n++] = ev.token;   /* the answer joins the conversation */
			continue;
		}
		if (ev.kind != RINGLM_EV_FINISH) continue;
		if (ev.finish_reason != RINGLM_FINISH_LENGTH && ev.finish_reason != RINGLM_FINISH_STOP)
			die("request ended %s", ringlm_reason_name(ev.finish_reason));
		generated += ev.n_tokens;
		decode_rows += ev.n_tokens ? ev.n_tokens - 1 : 0;
		if (++v->turn < v->turns && conv_next_turn(v)) {
			prompt_tokens += v->n;
			submit(cl, c, v);
			continue;
		}
		v->active = false;
		done++;
		if (started < c->conversations) {
			conv_init(c, v, started++, sharing);
			conv_next_turn(v);
			prompt_tokens += v->n;
			submit(cl, c, v);
		}
	}
	double wall = (double)(now_us() - t_start) / 1e6;
	ringlm_close(cl);
	result r = {0};
	/* the counters are published every few ms: read until every admission is counted (cache
	 * on: queries reach the prompt tokens) and two reads agree */
	double prev = -1;
	for (int i = 0; i < 500; i++) {
		char *m = http_get("/metrics");
		double it = metric(m, "ringlm_iteration_tokens_total"), q = metric(m, "vllm:prefix_cache_queries_total");
		r.hit_rate = q > 0 ? metric(m, "vllm:prefix_cache_hits_total") / q : 0;
		free(m);
		r.prefill_tokens = it - (double)decode_rows;
		if (it > 0 && it == prev && (!cache || q >= (double)prompt_tokens)) break;
		prev = it;
		usleep(10000);
	}
	stop_daemon();
	qsort(ttft, nt, sizeof *ttft, cmp_d);
	r.ttft_p50_ms = bench_median(ttft, (int)nt);
	r.tokens_per_s = (double)generated / wall;
	r.requests = nt;
	r.generated = generated;
	r.prompt_tokens = (double)prompt_tokens;
	free(cv);
	free(ttft);
	return r;
}

int main(int argc, char **argv)
{
	cfg c = {.conversations = 48, .concurrency = 4, .turns = 4, .system_prompts = 4, .system_len = 320,
		 .max_new = 24, .one_off = 0.1, .seed = 1};
	int rounds = 3;
	bool json = false;
	char model[512] = "", bin[512] = "build/bin";
	const char *shared = getenv("RINGLM_SHARED");
	snprintf(model, sizeof model, "%s/models/stories260K.bin", shared ? shared : "../shared");
	static const struct option lo[] = {
		{"json", 0, 0, 'j'}, {"rounds", 1, 0, 'r'}, {"conversations", 1, 0, 'n'}, {"concurrency", 1, 0, 'c'},
		{"turns", 1, 0, 't'}, {"system-prompts", 1, 0, 'k'}, {"system-len", 1, 0, 'l'}, {"one-off", 1, 0, 'o'},
		{"model", 1, 0, 'm'}, {"bin", 1, 0, 'b'}, {"seed", 1, 0, 's'}, {"max-tokens", 1, 0, 'x'}, {0, 0, 0, 0}};
	int o;
	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'j': json = true; break;
		case 'r': rounds = atoi(optarg); break;
		case 'n': c.conversations = atoi(optarg); break;
		case 'c': c.concurrency = atoi(optarg); break;
		case 't': c.turns = atoi(optarg); break;
		case 'k': c.system_prompts = atoi(optarg); break;
		case 'l': c.system_len = atoi(optarg); break;
		case 'o': c.one_off = atof(optarg); break;
		case 'm': snprintf(model, sizeof model, "%s", optarg); break;
		case 'b': snprintf(bin, sizeof bin, "%s", optarg); break;
		case 's': c.seed = strtoull(optarg, NULL, 0); break;
		case 'x': c.max_new = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: prefix_bench [--json] [--rounds N] [--conversations N] [--concurrency N] "
					"[--turns N] [--system-prompts N] [--system-len N] [--one-off F] [--max-tokens N] "
					"[--model PATH] [--bin DIR] [--seed N]\n");
			return 2;
		}
	}
	if (rounds < 1 || c.conversations < 1 || c.concurrency < 1 || c.turns < 1 || c.system_prompts < 1 ||
	    c.system_len < 1 || c.system_len > MAX_CTX - 100 || c.max_new < 1 || c.max_new > 40 || c.one_off < 0 || c.one_off > 1)
		die("bad arguments (system-len 1..%d, max-tokens 1..40)", MAX_CTX - 100);
	if (access(model, R_OK) != 0) die("model %s not readable (give --model or RINGLM_SHARED)", model);
	snprintf(dir, sizeof dir, "/tmp/ringlm-prefix-bench-XXXXXX");
	if (!mkdtemp(dir)) die("mkdtemp: %s", strerror(errno));
	signal(SIGPIPE, SIG_IGN);
	double t_on[16], t_off[16], p_on[16], p_off[16], h[16], ns_ratio[16];
	if (rounds > 16) rounds = 16;
	result last_on = {0}, last_off = {0};
	for (int i = 0; i < rounds; i++) {
		/* alternate which goes first, so drift of the machine falls on both */
		result off, on, ns_off, ns_on;
		if (i % 2 == 0) {
			off = run_phase(bin, model, &c, false, true);
			on = run_phase(bin, model, &c, true, true);
			ns_off = run_phase(bin, model, &c, false, false);
			ns_on = run_phase(bin, model, &c, true, false);
		} else {
			on = run_phase(bin, model, &c, true, true);
			off = run_phase(bin, model, &c, false, true);
			ns_on = run_phase(bin, model, &c, true, false);
			ns_off = run_phase(bin, model, &c, false, false);
		}
		t_on[i] = on.ttft_p50_ms;
		t_off[i] = off.ttft_p50_ms;
		p_on[i] = on.prefill_tokens;
		p_off[i] = off.prefill_tokens;
		h[i] = on.hit_rate;
		ns_ratio[i] = ns_off.tokens_per_s > 0 ? ns_on.tokens_per_s / ns_off.tokens_per_s : 0;
		last_on = on;
		last_off = off;
		if (!json)
			fprintf(stderr, "round %d: ttft p50 on %.2f off %.2f ms; prefill on %.0f off %.0f; hit %.3f; "
					"no-sharing tok/s on %.0f off %.0f\n", i + 1, on.ttft_p50_ms, off.ttft_p50_ms,
				on.prefill_tokens, off.prefill_tokens, on.hit_rate, ns_on.tokens_per_s, ns_off.tokens_per_s);
	}
	double ton = bench_median(t_on, rounds), toff = bench_median(t_off, rounds), pon = bench_median(p_on, rounds),
	       poff = bench_median(p_off, rounds), hr = bench_median(h, rounds), nsr = bench_median(ns_ratio, rounds);
	double ttft_ratio = ton > 0 ? toff / ton : 0, saved = poff > 0 ? 1 - pon / poff : 0;
	bool g1 = ttft_ratio >= 3, g2 = saved >= 0.70, g3 = nsr >= 0.97;
	if (json) {
		printf("{\"bench\":\"prefix_bench\",\"model\":\"%s\",\"rounds\":%d,\"conversations\":%d,\"concurrency\":%d,"
		       "\"requests\":%llu,\"ttft_p50_ms\":{\"on\":%.3f,\"off\":%.3f},\"ttft_ratio\":%.3f,"
		       "\"prefill_tokens\":{\"on\":%.0f,\"off\":%.0f},\"prefill_saved\":%.4f,\"hit_rate\":%.4f,"
		       "\"nosharing_throughput_ratio\":%.4f,\"goals\":{\"ttft_ratio_ge_3\":%s,\"prefill_saved_ge_0.70\":%s,"
		       "\"nosharing_ratio_ge_0.97\":%s}}\n",
		       model, rounds, c.conversations, c.concurrency, (unsigned long long)last_on.requests, ton, toff,
		       ttft_ratio, pon, poff, saved, hr, nsr, g1 ? "true" : "false", g2 ? "true" : "false",
		       g3 ? "true" : "false");
	} else {
		printf("prefix_bench (%s, %d rounds, %d conversations, %d at a time, %llu requests/phase; medians)\n", model,
		       rounds, c.conversations, c.concurrency, (unsigned long long)last_on.requests);
		printf("  TTFT p50        on %8.2f ms   off %8.2f ms   %.2fx lower   goal >= 3x: %s\n", ton, toff, ttft_ratio,
		       g1 ? "met" : "NOT met");
		printf("  prefill tokens  on %8.0f      off %8.0f      %.1f%% fewer   goal >= 70%%: %s\n", pon, poff,
		       100 * saved, g2 ? "met" : "NOT met");
		printf("  hit rate        %.1f%% of prompt tokens\n", 100 * hr);
		printf("  no sharing      throughput on/off %.3f   goal >= 0.97: %s\n", nsr, g3 ? "met" : "NOT met");
		(void)last_off;
	}
	cleanup();
	return 0;
}
