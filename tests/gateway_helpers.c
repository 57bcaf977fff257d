/* SPDX-License-Identifier: MIT */
/* tests/gateway_helpers.c — the gateway suites' daemon, gateway and HTTP (see the header). */
#include "tests/gateway_helpers.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "model/gguf_write.h"
#include "tools/prom.h"

th_daemon gwh_daemon;
th_proc gwh_gateway;
int gwh_port, gwh_metrics_port;

void gwh_need(void)
{
    char *a = th_path(th_bin_dir(), "ringlmd"), *b = th_path(th_bin_dir(), "ringlm-gateway");
    if (!th_exists(a) || !th_exists(b))
        cr_skip_test("ringlmd/ringlm-gateway not built in %s", th_bin_dir());
    free(a);
    free(b);
    free(th_shared_file("models/stories260K.bin"));
    free(th_shared_file("models/tok512.bin"));
}

void gwh_need_curl(void)
{
    char *out, *err;
    char *argv[] = {"curl", "--version", NULL};
    int rc = th_run(argv, &out, &err, 10);
    free(out);
    free(err);
    if (rc != 0) cr_skip_test("curl is not installed (scripts/install-deps.sh installs it)");
}

const char *gwh_dir(void)
{
    if (!gwh_daemon.dir[0]) th_daemon_init(&gwh_daemon);
    return gwh_daemon.dir;
}

static char *write_file(const char *name, const char *text)
{
    char *p = th_path(gwh_dir(), name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    fputs(text, f);
    fclose(f);
    return p;
}

char *gwh_policy(void)
{
    char text[768];
    snprintf(text, sizeof text,
             "[scheduler]\nmode = token_budget\ntoken_budget = 128\nprefill_chunk = 64\n"
             "default_class = chat\ndefault_tenant = shared\n"
             "[class chat]\npriority = 10\n[class batch]\npriority = 0\n"
             "[tenant shared]\nweight = 1\n[tenant alice]\nweight = 1\n[tenant bob]\nweight = 1\n"
             "[tenant tiny]\nmax_queued_tokens = 4\n[tenant held]\ntoken_rate_per_s = 0.001\n"
             "[trust]\nuids = %u\n",
             (unsigned)getuid());
    return write_file("test.policy", text);
}

char *gwh_keys(void)
{
    return write_file(
        "keys", "# test keys\nsk-alice-0001 alice\nsk-bob-00001 bob batch\nsk-tiny-00001 tiny\n"
                "sk-held-00001 held\n");
}

void gwh_start_daemon(const char *const *extra)
{
    gwh_dir();
    char *model = th_shared_file("models/stories260K.bin");
    char *tok = th_shared_file("models/tok512.bin"); /* so it enforces constraints */
    char *policy = gwh_policy();
    const char *argv[32] = {
        "--model",          model,  "--policy",    policy, "--metrics", "127.0.0.1:0",
        "--drain-grace-ms", "5000", "--tokenizer", tok};
    int n = 10;
    /* another model (in extra): tok512 is stories260K's vocabulary, not its */
    for (int i = 0; extra && extra[i]; i++)
        if (!strcmp(extra[i], "--model")) n = 8;
    for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    th_daemon_start(&gwh_daemon, argv, GWH_DAEMON_START_MS);
    th_proc p = {.pid = gwh_daemon.pid};
    snprintf(p.log, sizeof p.log, "%s", gwh_daemon.log);
    gwh_metrics_port = th_proc_log_int(&p, "metrics on port ", GWH_DAEMON_START_MS);
    free(model);
    free(tok);
    free(policy);
}

const char *gwh_served_model = "stories";

void gwh_start_gateway(const char *const *extra)
{
    gwh_dir();
    char *gw = th_path(th_bin_dir(), "ringlm-gateway");
    char *tok = th_shared_file("models/tok512.bin");
    char *log = th_path(gwh_dir(), "gateway.log");
    const char *argv[40] = {gw,         "--listen",        "127.0.0.1:0",
                            "--socket", gwh_daemon.sock,   "--tokenizer",
                            tok,        "--max-model-len", "512"};
    int n = 9;
    if (gwh_served_model) {
        argv[n++] = "--served-model-name";
        argv[n++] = gwh_served_model;
    }
    for (int i = 0; extra && extra[i] && n < 39; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    th_proc_start(&gwh_gateway, argv, log);
    gwh_port = th_proc_log_int(&gwh_gateway, "listening on http://127.0.0.1:", 10000);
    free(gw);
    free(tok);
    free(log);
}

void gwh_wait_healthy(int timeout_ms)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int st = 0;
        char *b = th_http_get(gwh_port, "/health", &st, NULL, 0);
        free(b);
        if (st == 200) return;
        cr_assert(th_now_ms() < deadline, "/health still %d after %d ms: %s", st, timeout_ms,
                  th_read_file(gwh_gateway.log));
        th_pause_ms(10);
    }
}

void gwh_stop_all(void)
{
    th_proc_stop(&gwh_gateway, SIGTERM, 10000);
    th_daemon_stop(&gwh_daemon, SIGTERM, 15000);
    th_daemon_cleanup(&gwh_daemon);
}

gwh_resp gwh_curl(const char *path, const char *key, const char *body)
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
    int rc = th_run((char *const *)argv, &out, &err, 90);
    cr_assert_eq(rc, 0, "curl %s failed (%d): %s", url, rc, err);
    free(err);
    gwh_resp r = {0};
    char *sep = strstr(out, "\r\n\r\n");
    cr_assert_not_null(sep, "no header end in: %s", out);
    *sep = 0;
    r.head = strdup(out);
    r.body = strdup(sep + 4);
    sscanf(out, "HTTP/%*s %d", &r.status);
    free(out);
    return r;
}

void gwh_resp_free(gwh_resp *r)
{
    free(r->head);
    free(r->body);
}

int gwh_connect(void)
{
    return th_tcp_connect(gwh_port);
}

void gwh_send_post(int fd, const char *path, const char *key, const char *body)
{
    char head[512];
    int n = snprintf(
        head, sizeof head,
        "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s%s%s"
        "Content-Length: %zu\r\nConnection: close\r\n\r\n",
        path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "", strlen(body));
    th_send_all(fd, head, (size_t)n);
    th_send_all(fd, body, strlen(body));
}

static char *metrics_of(int port, const char *who)
{
    int st = 0;
    char *b = th_http_get(port, "/metrics", &st, NULL, 0);
    cr_assert(b && st == 200, "%s's /metrics (port %d) answered %d", who, port, st);
    return b;
}

char *gwh_daemon_metrics(void)
{
    return metrics_of(gwh_metrics_port, "ringlmd");
}
char *gwh_gateway_metrics(void)
{
    return metrics_of(gwh_port, "ringlm-gateway");
}

double gwh_metric(const char *text, const char *series)
{
    /* exact series: prom_value matches a name with labels literally */
    double v = prom_value(text, series);
    return isnan(v) ? 0 : v;
}

/* ---- stories260K's vocabulary as a GGUF tokenizer ------------------------------------------ */
char *gwh_stories_gguf(const char *name, const char *template)
{
    return gwh_stories_gguf_special(name, template, -1, -1);
}

char *gwh_stories_gguf_special(const char *name, const char *template, int add_bos, int add_eos)
{
    char *src = th_shared_file("models/tok512.bin");
    FILE *f = fopen(src, "rb");
    cr_assert_not_null(f, "%s", src);
    enum { N = 512 };
    char *pieces[N];
    const char *toks[N];
    size_t lens[N];
    float scores[N];
    int32_t types[N];
    int32_t maxlen;
    cr_assert_eq(fread(&maxlen, 4, 1, f), 1);
    for (int i = 0; i < N; i++) {
        int32_t len;
        cr_assert_eq(fread(&scores[i], 4, 1, f), 1);
        cr_assert_eq(fread(&len, 4, 1, f), 1);
        cr_assert(len > 0 && len < 64, "%s: token %d has length %d", src, i, len);
        char raw[64], buf[256];
        cr_assert_eq(fread(raw, 1, (size_t)len, f), (size_t)len);
        size_t o = 0;
        if (i == 1 || i == 2)
            o = (size_t)snprintf(buf, sizeof buf, "%s", i == 1 ? "<s>" : "</s>");
        else
            for (int k = 0; k < len; k++) {
                if (raw[k] == ' ') { /* SentencePiece writes a space as U+2581 */
                    memcpy(buf + o, "\xe2\x96\x81", 3);
                    o += 3;
                } else {
                    buf[o++] = raw[k];
                }
            }
        buf[o] = 0;
        pieces[i] = strdup(buf);
        toks[i] = pieces[i];
        lens[i] = o;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1; /* unknown, control, byte, normal */
    }
    fclose(f);
    free(src);
    char *path = th_path(gwh_dir(), name);
    gguf_writer *w = gw_new();
    gw_str(w, "general.architecture", "llama");
    gw_str(w, "tokenizer.ggml.model", "llama");
    gw_str_arr(w, "tokenizer.ggml.tokens", toks, lens, N);
    gw_f32_arr(w, "tokenizer.ggml.scores", scores, N);
    gw_i32_arr(w, "tokenizer.ggml.token_type", types, N);
    gw_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gw_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (add_bos >= 0) gw_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (add_eos >= 0) gw_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
    if (template) gw_str(w, "tokenizer.chat_template", template);
    cr_assert_eq(gw_write(w, path), 0, "writing %s", path);
    gw_free(w);
    for (int i = 0; i < N; i++) free(pieces[i]);
    return path;
}

/* ---- a JSON answer without whitespace ----------------------------------------------------- */
json_t *gwh_whitespace_bias(void)
{
    char *tp = th_shared_file("models/tok512.bin");
    ringlm_tokenizer *t;
    cr_assert_eq(ringlm_tokenizer_load(tp, 512, &t), 0, "%s", ringlm_errdetail());
    json_t *b = json_object();
    for (int32_t id = 0; id < 512; id++) {
        const char *p;
        if (ringlm_token_text(t, 3, id, &p) < 0 || !*p || strspn(p, " \t\r\n") != strlen(p))
            continue;
        char k[16];
        snprintf(k, sizeof k, "%d", id);
        json_object_set_new(b, k, json_integer(-100));
    }
    ringlm_tokenizer_free(t);
    free(tp);
    return b;
}

void gwh_start_with_template(const char *file, const char *jinja, const char *const *extra)
{
    char *tok = gwh_stories_gguf(file, jinja);
    const char *argv[16] = {"--tokenizer", tok};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 15; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    gwh_start_daemon(NULL);
    gwh_start_gateway(argv);
    gwh_wait_healthy(10000);
    free(tok);
}

void gwh_run_node_sdk_test(const char *script, int passes)
{
    char *out, *err;
    char *ver[] = {"node", "--version", NULL};
    if (th_run(ver, &out, &err, 20) != 0)
        cr_skip_test("node is not installed: the OpenAI SDK test skips");
    free(out);
    free(err);
    if (!th_exists("tests/node/node_modules/openai/package.json"))
        cr_skip_test("tests/node/node_modules/openai is absent (run `make deps`): the OpenAI SDK "
                     "test skips");
    json_t *bias = gwh_whitespace_bias();
    char *b = json_dumps(bias, JSON_COMPACT);
    json_decref(bias);
    setenv("NO_WS_BIAS", b, 1);
    free(b);
    char url[64], path[256], want[32];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", gwh_port);
    setenv("GATEWAY_URL", url, 1);
    snprintf(path, sizeof path, "tests/node/%s", script);
    char *argv[] = {"node", "--test", "--test-reporter=tap", path, NULL};
    int rc = th_run(argv, &out, &err, 150);
    char *log = th_read_file(gwh_gateway.log);
    cr_assert_eq(rc, 0, "%s failed (exit %d):\n%s\n%s\ngateway log:\n%s", script, rc, out, err,
                 log);
    snprintf(want, sizeof want, "# pass %d", passes);
    cr_assert(strstr(out, want), "expected %d passing checks:\n%s", passes, out);
    free(log);
    free(out);
    free(err);
}

/* The cell between the i-th and i+1-th '|' of line, trimmed, without its backticks. */
static void doc_cell(const char *line, int i, char *out, size_t n)
{
    const char *p = line;
    for (int k = 0; k <= i; k++) {
        p = strchr(p, '|');
        cr_assert_not_null(p, "row '%s' has no cell %d", line, i);
        p++;
    }
    const char *end = strchr(p, '|');
    cr_assert_not_null(end, "row '%s' has no cell %d", line, i);
    while (p < end && *p == ' ') p++;
    while (end > p && end[-1] == ' ') end--;
    if (end - p >= 2 && *p == '`' && end[-1] == '`') {
        p++;
        end--;
    }
    size_t len = (size_t)(end - p);
    cr_assert_lt(len, n, "cell '%.*s' too long", (int)len, p);
    memcpy(out, p, len);
    out[len] = 0;
}

int gwh_doc_rows(const char *table, bool with_endpoints, gwh_doc_row *rows, int max)
{
    FILE *f = fopen("docs/gateway.md", "r");
    if (!f) cr_skip_test("docs/gateway.md not found (run from the repository root)");
    char begin[64], end[64], line[1024];
    snprintf(begin, sizeof begin, "<!-- %s table", table);
    snprintf(end, sizeof end, "<!-- end of the %s table", table);
    int n = 0, in = 0, c = with_endpoints ? 1 : 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, begin)) {
            in = 1;
            continue;
        }
        if (strstr(line, end)) break;
        if (!in || line[0] != '|' || strstr(line, "| --- ") || strstr(line, "| field |")) continue;
        cr_assert_lt(n, max);
        gwh_doc_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        doc_cell(line, 0, r->name, sizeof r->name);
        if (with_endpoints) doc_cell(line, 1, r->endpoints, sizeof r->endpoints);
        doc_cell(line, c + 1, r->status, sizeof r->status);
        doc_cell(line, c + 2, r->example, sizeof r->example);
        doc_cell(line, c + 3, r->accepted, sizeof r->accepted);
    }
    fclose(f);
    cr_assert_gt(n, 0, "docs/gateway.md has no %s table", table);
    return n;
}
