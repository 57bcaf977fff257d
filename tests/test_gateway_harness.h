/* SPDX-License-Identifier: MIT */
/*
 * Shared by the gateway suites: a real ringlmd and a real ringlm-gateway on private
 * sockets/ports, HTTP through curl (the real client) or a raw socket (for what curl cannot
 * do: hang up mid-stream, stall mid-header), the daemon's /metrics. Every process started
 * here is stopped by gwh_stop_all (the suites' fini) and dies with the test (PDEATHSIG).
 */
#ifndef RINGLM_TESTS_GATEWAY_HARNESS_H
#define RINGLM_TESTS_GATEWAY_HARNESS_H

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static __attribute__((unused)) const char *gwh_shared(void)
{
	const char *s = getenv("RINGLM_SHARED");
	return s && *s ? s : "../shared";
}

static __attribute__((unused)) const char *gwh_bin(void)
{
	const char *s = getenv("RINGLM_BIN");
	return s && *s ? s : "build/bin";
}

static __attribute__((unused)) char *gwh_path(const char *a, const char *b)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", a, b) > 0);
	return p;
}

static __attribute__((unused)) bool gwh_exists(const char *p) { return access(p, R_OK) == 0; }

static uint64_t gwh_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static __attribute__((unused)) void gwh_nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000l};
	nanosleep(&ts, NULL);
}

static __attribute__((unused)) char *gwh_read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) return strdup("");
	size_t cap = 4096, len = 0;
	char *b = malloc(cap);
	size_t n;
	while ((n = fread(b + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (len + 1 >= cap) b = realloc(b, cap *= 2);
	}
	b[len] = 0;
	fclose(f);
	return b;
}

/* Runs argv; returns the exit status; *out gets stdout (malloc'ed), *err stderr. */
static __attribute__((unused)) int gwh_run(char *const argv[], char **out, char **err, int timeout_s)
{
	int po[2], pe[2];
	cr_assert(pipe(po) == 0 && pipe(pe) == 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	size_t cap[2] = {4096, 4096}, len[2] = {0, 0};
	char *buf[2] = {malloc(4096), malloc(4096)};
	int fds[2] = {po[0], pe[0]}, open_n = 2;
	uint64_t deadline = gwh_now_ms() + (uint64_t)timeout_s * 1000;
	while (open_n > 0) {
		struct pollfd p[2];
		int n = 0, map[2];
		for (int i = 0; i < 2; i++)
			if (fds[i] >= 0) {
				p[n] = (struct pollfd){.fd = fds[i], .events = POLLIN};
				map[n++] = i;
			}
		uint64_t now = gwh_now_ms();
		if (now >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			cr_assert_fail("%s did not finish within %d s; stdout so far: %.*s", argv[0], timeout_s,
				       (int)len[0], buf[0]);
		}
		if (poll(p, (nfds_t)n, (int)(deadline - now)) <= 0) continue;
		for (int j = 0; j < n; j++) {
			if (!p[j].revents) continue;
			int i = map[j];
			if (len[i] + 1024 >= cap[i]) buf[i] = realloc(buf[i], cap[i] *= 2);
			ssize_t r = read(fds[i], buf[i] + len[i], cap[i] - len[i] - 1);
			if (r <= 0) {
				close(fds[i]);
				fds[i] = -1;
				open_n--;
			} else {
				len[i] += (size_t)r;
			}
		}
	}
	buf[0][len[0]] = 0;
	buf[1][len[1]] = 0;
	int st;
	waitpid(pid, &st, 0);
	*out = buf[0];
	if (err) *err = buf[1];
	else free(buf[1]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- processes ------------------------------------------------------------------------- */
typedef struct gwh_proc {
	pid_t pid;
	char log[128];
} gwh_proc;

static gwh_proc gwh_daemon = {.pid = -1}, gwh_gateway = {.pid = -1};
static char gwh_sock[108];
static char gwh_dir[64];
static int gwh_port, gwh_metrics_port;

static __attribute__((unused)) pid_t gwh_spawn(const char *const *argv, const char *log)
{
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* SIGTERM, then waits up to timeout_ms; SIGKILL after. Returns the exit status (128+sig
 * when killed by a signal, -1 when it had to be killed). */
static __attribute__((unused)) int gwh_stop(gwh_proc *p, int timeout_ms)
{
	if (p->pid <= 0) return 0;
	kill(p->pid, SIGTERM);
	uint64_t dl = gwh_now_ms() + (uint64_t)timeout_ms;
	int st, rc = -1;
	for (;;) {
		pid_t w = waitpid(p->pid, &st, WNOHANG);
		if (w == p->pid) {
			rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			break;
		}
		if (gwh_now_ms() > dl) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &st, 0);
			break;
		}
		gwh_nap_ms(10);
	}
	p->pid = -1;
	return rc;
}

/* Waits for p to exit by itself within timeout_ms; its exit status or -1. */
static __attribute__((unused)) int gwh_wait_exit(gwh_proc *p, int timeout_ms)
{
	uint64_t dl = gwh_now_ms() + (uint64_t)timeout_ms;
	int st;
	while (gwh_now_ms() < dl) {
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = -1;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		gwh_nap_ms(10);
	}
	return -1;
}

static __attribute__((unused)) void gwh_stop_all(void)
{
	gwh_stop(&gwh_gateway, 10000);
	gwh_stop(&gwh_daemon, 15000);
	if (gwh_dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf %s", gwh_dir);
		if (system(cmd)) {}
		gwh_dir[0] = 0;
	}
}

static __attribute__((unused)) void gwh_need(void)
{
	char *a = gwh_path(gwh_bin(), "ringlmd"), *b = gwh_path(gwh_bin(), "ringlm-gateway");
	if (!gwh_exists(a) || !gwh_exists(b)) cr_skip_test("ringlmd/ringlm-gateway not built in %s", gwh_bin());
	free(a);
	free(b);
	char *m = gwh_path(gwh_shared(), "models/stories260K.bin"), *t = gwh_path(gwh_shared(), "models/tok512.bin");
	if (!gwh_exists(m) || !gwh_exists(t))
		cr_skip_test("stories260K / tok512 not under %s (set RINGLM_SHARED)", gwh_shared());
	free(m);
	free(t);
}

static __attribute__((unused)) void gwh_mkdir(void)
{
	if (gwh_dir[0]) return;
	snprintf(gwh_dir, sizeof gwh_dir, "/tmp/ringlm-gw-%d-XXXXXX", getpid());
	cr_assert(mkdtemp(gwh_dir), "mkdtemp: %s", strerror(errno));
	snprintf(gwh_sock, sizeof gwh_sock, "%s/d.sock", gwh_dir);
}

/* The test policy: tenants shared (default), alice, bob, tiny (a 4-token queue quota);
 * classes chat (default) and batch; this uid trusted to tag tenants. */
static __attribute__((unused)) char *gwh_policy(void)
{
	gwh_mkdir();
	char *p = gwh_path(gwh_dir, "test.policy");
	FILE *f = fopen(p, "w");
	cr_assert(f);
	fprintf(f, "[scheduler]\nmode = token_budget\ntoken_budget = 128\nprefill_chunk = 64\n"
		   "default_class = chat\ndefault_tenant = shared\n"
		   "[class chat]\npriority = 10\n[class batch]\npriority = 0\n"
		   "[tenant shared]\nweight = 1\n[tenant alice]\nweight = 1\n[tenant bob]\nweight = 1\n"
		   "[tenant tiny]\nmax_queued_tokens = 4\n[trust]\nuids = %u\n", (unsigned)getuid());
	fclose(f);
	return p;
}

static __attribute__((unused)) char *gwh_keys(void)
{
	gwh_mkdir();
	char *p = gwh_path(gwh_dir, "keys");
	FILE *f = fopen(p, "w");
	cr_assert(f);
	fprintf(f, "# test keys\nsk-alice-0001 alice\nsk-bob-00001 bob batch\nsk-tiny-00001 tiny\n");
	fclose(f);
	return p;
}

/* Reads "port N" / "http://ADDR:N" out of a log once the process has written it. */
static __attribute__((unused)) int gwh_port_from_log(gwh_proc *p, const char *marker, int timeout_ms)
{
	uint64_t dl = gwh_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		char *log = gwh_read_file(p->log);
		char *m = strstr(log, marker);
		if (m) {
			int port = atoi(m + strlen(marker));
			free(log);
			return port;
		}
		int st;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = -1;
			cr_assert_fail("%s exited at start: %s", p->log, log);
		}
		if (gwh_now_ms() > dl) cr_assert_fail("no '%s' in %s within %d ms: %s", marker, p->log, timeout_ms, log);
		free(log);
		gwh_nap_ms(10);
	}
}

static __attribute__((unused)) void gwh_start_daemon(void)
{
	gwh_mkdir();
	char *model = gwh_path(gwh_shared(), "models/stories260K.bin");
	char *ringlmd = gwh_path(gwh_bin(), "ringlmd");
	char *policy = gwh_policy();
	snprintf(gwh_daemon.log, sizeof gwh_daemon.log, "%s/ringlmd.log", gwh_dir);
	const char *argv[] = {ringlmd, "--socket", gwh_sock, "--numa-node", "off", "--model", model, "--policy",
			      policy, "--metrics", "127.0.0.1:0", "--drain-grace-ms", "5000", NULL};
	gwh_daemon.pid = gwh_spawn(argv, gwh_daemon.log);
	gwh_metrics_port = gwh_port_from_log(&gwh_daemon, "metrics on port ", 20000);
	uint64_t dl = gwh_now_ms() + 20000;
	struct stat sb;
	while (stat(gwh_sock, &sb) != 0) {
		cr_assert(gwh_now_ms() < dl, "ringlmd did not create its socket");
		gwh_nap_ms(5);
	}
	free(model);
	free(ringlmd);
	free(policy);
}

/* extra: NULL-terminated further gateway options. */
static __attribute__((unused)) void gwh_start_gateway(const char *const *extra)
{
	gwh_mkdir();
	char *gw = gwh_path(gwh_bin(), "ringlm-gateway");
	char *tok = gwh_path(gwh_shared(), "models/tok512.bin");
	snprintf(gwh_gateway.log, sizeof gwh_gateway.log, "%s/gateway.log", gwh_dir);
	const char *argv[32] = {gw, "--listen", "127.0.0.1:0", "--socket", gwh_sock, "--tokenizer", tok,
				"--served-model-name", "stories", "--max-model-len", "512"};
	int n = 11;
	for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
	argv[n] = NULL;
	gwh_gateway.pid = gwh_spawn(argv, gwh_gateway.log);
	gwh_port = gwh_port_from_log(&gwh_gateway, "listening on http://127.0.0.1:", 10000);
	free(gw);
	free(tok);
}

/* ---- HTTP ------------------------------------------------------------------------------ */
typedef struct gwh_resp {
	int status;
	char *head; /* status line and headers */
	char *body;
} gwh_resp;

static __attribute__((unused)) void gwh_resp_free(gwh_resp *r)
{
	free(r->head);
	free(r->body);
}

/* curl -s -i [-H 'Authorization: Bearer KEY'] -d BODY URL; key NULL = none; body NULL = GET. */
static __attribute__((unused)) gwh_resp gwh_curl(const char *path, const char *key, const char *body)
{
	char url[256], auth[160];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", gwh_port, path);
	const char *argv[16];
	int n = 0;
	argv[n++] = "curl";
	argv[n++] = "-s";
	argv[n++] = "-i";
	argv[n++] = "-N";
	argv[n++] = "--max-time";
	argv[n++] = "60";
	if (key) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
		argv[n++] = "-H";
		argv[n++] = auth;
	}
	if (body) {
		argv[n++] = "-H";
		argv[n++] = "Content-Type: application/json";
		argv[n++] = "--data-binary";
		argv[n++] = body;
	}
	argv[n++] = url;
	argv[n] = NULL;
	char *out, *err;
	int rc = gwh_run((char *const *)argv, &out, &err, 90);
	cr_assert_eq(rc, 0, "curl %s failed (%d): %s", url, rc, err);
	free(err);
	gwh_resp r = {0};
	char *sep = strstr(out, "\r\n\r\n");
	cr_assert(sep, "no header end in: %s", out);
	*sep = 0;
	r.head = strdup(out);
	r.body = strdup(sep + 4);
	sscanf(out, "HTTP/%*s %d", &r.status);
	free(out);
	return r;
}

static __attribute__((unused)) bool gwh_have_curl(void)
{
	char *out, *err;
	char *argv[] = {"curl", "--version", NULL};
	int rc = gwh_run(argv, &out, &err, 10);
	free(out);
	free(err);
	return rc == 0;
}

/* A raw TCP connection to the gateway. */
static __attribute__((unused)) int gwh_connect(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gwh_port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
	return fd;
}

static __attribute__((unused)) void gwh_send_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
		cr_assert(w > 0, "send: %s", strerror(errno));
		s += w;
		n -= (size_t)w;
	}
}

static __attribute__((unused)) void gwh_send_post(int fd, const char *path, const char *key, const char *body)
{
	char head[512];
	int n = snprintf(head, sizeof head,
			 "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s%s%s"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
			 path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "", strlen(body));
	gwh_send_all(fd, head, (size_t)n);
	gwh_send_all(fd, body, strlen(body));
}

/* Reads until `until` appears in what was read (NULL: until EOF) or timeout_ms passes.
 * Returns what was read (malloc'ed); *eof tells whether the peer closed. */
static __attribute__((unused)) char *gwh_read_until(int fd, const char *until, int timeout_ms, bool *eof)
{
	size_t cap = 8192, len = 0;
	char *b = malloc(cap);
	b[0] = 0;
	*eof = false;
	uint64_t dl = gwh_now_ms() + (uint64_t)timeout_ms;
	while (!(until && strstr(b, until))) {
		uint64_t now = gwh_now_ms();
		if (now >= dl) break;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, (int)(dl - now)) <= 0) continue;
		if (len + 4096 >= cap) b = realloc(b, cap *= 2);
		ssize_t r = recv(fd, b + len, cap - len - 1, 0);
		if (r <= 0) {
			*eof = true;
			break;
		}
		len += (size_t)r;
		b[len] = 0;
	}
	return b;
}

/* The daemon's /metrics, raw (GET over a socket). */
static __attribute__((unused)) char *gwh_daemon_metrics(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gwh_metrics_port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
	const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	gwh_send_all(fd, req, strlen(req));
	bool eof;
	char *b = gwh_read_until(fd, NULL, 10000, &eof);
	close(fd);
	return b;
}

/* Value of the sample line that starts with `series` (exact name and labels), or 0. */
static __attribute__((unused)) double gwh_metric(const char *text, const char *series)
{
	size_t n = strlen(series);
	for (const char *p = text; p && *p;) {
		if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		if (p) p++;
	}
	return 0;
}

#endif
