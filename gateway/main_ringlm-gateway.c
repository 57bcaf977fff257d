/* SPDX-License-Identifier: MIT */
/*
 * ringlm-gateway — the OpenAI-compatible HTTP front door of ringlmd.
 *
 * A separate process and an ordinary shared-memory client of ringlmd (a few sessions,
 * --sessions, every HTTP stream multiplexed over them). It owns HTTP, JSON, API keys,
 * tokenization and chat templates; the daemon's loop never parses text. Run it under a uid that the daemon's
 * policy lists in [trust], so that the tenant of each request can come from its API key.
 *
 *   ringlm-gateway --listen 127.0.0.1:8000 --socket /run/ringlm/ringlmd.sock \
 *                  --tokenizer tok.bin [--api-keys keys.txt] [--chat-template chatml]
 *
 * SIGTERM/SIGINT drain: the listening socket closes, /health turns 503, requests in flight
 * finish (cancelled after --drain-grace-ms), then the process exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ringlm.h"
#include "formats/api_keys.h"
#include "gateway/gw_reason.h"
#include "gateway/gw_route.h"
#include "gateway/gw_server.h"
#include "gateway/gw_tools.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ringlm-gateway --listen ADDR:PORT --tokenizer FILE [options]\n"
        "  --listen ADDR:PORT       HTTP address (IPv4, or [IPv6]:PORT; port 0 = any free one,\n"
        "                           printed at start; default 127.0.0.1:8000)\n"
        "  --socket PATH            ringlmd's socket (default $" RINGLM_SOCKET_ENV
        ", else " RINGLM_DEFAULT_SOCKET ");\n"
        "                           more than once: one ringlmd each (one per NUMA node), a\n"
        "                           daemon picked per request by prefix affinity and load\n"
        "                           (docs/fleet.md)\n"
        "  --affinity-block-tokens N  with several --socket: tokens per prompt block hashed\n"
        "                           for prefix affinity (default 16, ringlmd's block size)\n"
        "  --tokenizer FILE         the model's tokenizer (llama2.c tokenizer.bin); without it\n"
        "                           prompts must be token ids and replies carry no text\n"
        "  --api-keys FILE          lines 'KEY TENANT [CLASS]': the tenant (tagged on each\n"
        "                           request; the daemon's [trust] must list this uid) and\n"
        "                           default class of a key; other keys get 401. Without it\n"
        "                           every request is this process's own tenant\n"
        "  --chat-template NAME     %s; default: the model file's own (a\n"
        "                           GGUF tokenizer's chat_template, rendered as Jinja; one\n"
        "                           that does not parse is an error), else plain\n"
        "  --reasoning-parser NAME  deepseek_r1 or qwen3: a chat answer's <think>...</think>\n"
        "                           comes back as reasoning_content, the rest as content\n"
        "                           (vLLM's option and fields; default: all of it is content)\n"
        "  --tool-call-parser NAME  hermes, llama3_json, mistral or pythonic: the syntax of the\n"
        "                           model's tool calls, parsed out of chat answers into "
        "tool_calls\n"
        "                           (vLLM's option; default: the one the chat template\n"
        "                           writes; none: tool calls are not parsed)\n"
        "  --served-model-name NAME the model id of /v1/models, of requests and of the relayed\n"
        "                           vllm:* metrics (default: the daemon's, ringlmd\n"
        "                           --served-model-name)\n"
        "  --max-model-len N        context length in tokens, for chat's default max_tokens\n"
        "                           and /v1/models (default: the GGUF model file's\n"
        "                           context_length, else unknown: chat defaults to 256)\n"
        "  --max-body-bytes N       larger request bodies get 413 (default 1048576)\n"
        "  --http-timeout-s N       close a connection idle this long mid-request (default 30)\n"
        "  --http-head-timeout-s N  a connection must send a whole request head within N s of\n"
        "                           opening or of its previous answer, else it is closed\n"
        "                           (default 10; 0: no deadline)\n"
        "  --http-body-timeout-s N  and the whole body within N s of the head (default 60;\n"
        "                           0: no deadline)\n"
        "  --max-connections N      open HTTP connections at once (default 4096); at the\n"
        "                           limit a newcomer takes the place of the oldest connection\n"
        "                           still sending its head\n"
        "  --max-connections-per-addr N  open connections from one client address (default\n"
        "                           2048; 0: no bound; behind a proxy all share its address)\n"
        "  --daemon-metrics ADDR:PORT  ringlmd's --metrics address: its vllm:* gauges and\n"
        "                           counters also on this /metrics (routers read them where\n"
        "                           they send requests), refreshed every 100 ms; once per\n"
        "                           daemon: their sum, as one vLLM server's (docs/fleet.md)\n"
        "  --sessions N             shared-memory sessions with ringlmd, streams spread over\n"
        "                           them (1..64, default 4: ringlmd holds at most 1,024\n"
        "                           requests in flight per session)\n"
        "  --tokenize-threads N     threads that parse request bodies, apply the chat template\n"
        "                           and tokenize, off the HTTP thread (default 2)\n"
        "  --tokenize-queue N       requests waiting for one of them; more get 503 with\n"
        "                           Retry-After (default 4096, as --max-connections: a\n"
        "                           burst of small requests waits; lower it to shed load\n"
        "                           sooner)\n"
        "  --drain-grace-ms N       on SIGTERM, requests in flight get this long (default 30000)\n"
        "  --quiet                  no log lines but errors\n"
        "  --version, --help\n",
        ringlm_chat_template_names());
}

/* Only a GGUF file carries a chat template (ringlm_tokenizer_load says what else a file is). */
static bool is_gguf(const char *path)
{
    char magic[4] = "";
    FILE *f = fopen(path, "rb");
    bool gguf = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    if (f) fclose(f);
    return gguf;
}

/* With --chat-template, a GGUF tokenizer file whose template is of another built-in family is
 * said on stderr (the file's own template is rendered as Jinja when --chat-template is not
 * given). Returns 0 or -1 (the file cannot be read). */
static int model_template(const char *path, const char *explicit_name, int *tpl, const char **from)
{
    if (!is_gguf(path)) return 0;
    int t = ringlm_chat_template_of_model(path);
    if (t == -ENOENT) return 0; /* the file has no tokenizer.chat_template */
    if (t < 0 && (t != -ENOTSUP || !explicit_name)) {
        if (t == -ENOTSUP)
            fprintf(stderr,
                    "ringlm-gateway: %s: its chat template is none of the built-in ones: %s; "
                    "choose one with --chat-template NAME\n",
                    path, ringlm_errdetail());
        else
            fprintf(stderr, "ringlm-gateway: %s\n", ringlm_errdetail());
        return -1;
    }
    if (!explicit_name) {
        *tpl = t;
        *from = "the model file's chat_template";
    } else if (t >= 0 && t != *tpl) {
        fprintf(stderr, "ringlm-gateway: note: --chat-template %s, but %s's chat template is %s\n",
                explicit_name, path, ringlm_chat_template_name(t));
    }
    return 0;
}

static long parse_num(const char *opt, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "ringlm-gateway: %s '%s': expected an integer in [%ld, %ld]\n", opt, v, lo,
                hi);
        exit(2);
    }
    return x;
}

/* "ADDR:PORT", "[V6]:PORT" or ":PORT". */
static void parse_listen(const char *v, char *addr, size_t addr_len, uint16_t *port)
{
    const char *colon;
    if (v[0] == '[') {
        const char *rb = strchr(v, ']');
        if (!rb || rb[1] != ':' || (size_t)(rb - v - 1) >= addr_len) goto bad;
        memcpy(addr, v + 1, (size_t)(rb - v - 1));
        addr[rb - v - 1] = 0;
        colon = rb + 1;
    } else {
        colon = strrchr(v, ':');
        if (!colon || (size_t)(colon - v) >= addr_len) goto bad;
        memcpy(addr, v, (size_t)(colon - v));
        addr[colon - v] = 0;
        if (!addr[0]) snprintf(addr, addr_len, "127.0.0.1");
    }
    *port = (uint16_t)parse_num("--listen port", colon + 1, 0, 65535);
    return;
bad:
    fprintf(stderr, "ringlm-gateway: --listen '%s': expected ADDR:PORT or [IPV6]:PORT\n", v);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *tok_path = NULL, *keys_path = NULL, *tpl_name = NULL, *tool_parser_name = NULL;
    char addr[64] = "127.0.0.1";
    gw_cfg cfg = {
        .port = 8000,
        .max_body_bytes = 1 << 20,
        .http_timeout_s = 30,
        .http_head_timeout_s = 10,
        .http_body_timeout_s = 60,
        .max_connections = 4096,
        .max_connections_per_addr = 2048,
        .sessions = 4,
        .prep_threads = 2,
        .prep_queue = 4096,
    };
    long grace_ms = 30000;
    const char *sockets[GW_MAX_DAEMONS], *dmetrics[GW_MAX_DAEMONS];
    unsigned n_sockets = 0, n_dmetrics = 0;
    static const struct option opts[] = {
        {"listen", required_argument, 0, 'l'},
        {"socket", required_argument, 0, 's'},
        {"affinity-block-tokens", required_argument, 0, 'F'},
        {"tokenizer", required_argument, 0, 't'},
        {"api-keys", required_argument, 0, 'k'},
        {"chat-template", required_argument, 0, 'c'},
        {"reasoning-parser", required_argument, 0, 'R'},
        {"tool-call-parser", required_argument, 0, 'U'},
        {"served-model-name", required_argument, 0, 'm'},
        {"max-model-len", required_argument, 0, 'L'},
        {"max-body-bytes", required_argument, 0, 'B'},
        {"http-timeout-s", required_argument, 0, 'T'},
        {"max-connections", required_argument, 0, 'C'},
        {"max-connections-per-addr", required_argument, 0, 'A'},
        {"http-head-timeout-s", required_argument, 0, 'H'},
        {"http-body-timeout-s", required_argument, 0, 'Y'},
        {"sessions", required_argument, 0, 'S'},
        {"tokenize-threads", required_argument, 0, 'P'},
        {"tokenize-queue", required_argument, 0, 'Q'},
        {"daemon-metrics", required_argument, 0, 'M'},
        {"drain-grace-ms", required_argument, 0, 'g'},
        {"quiet", no_argument, 0, 'q'},
        {"version", no_argument, 0, 'V'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'l': parse_listen(optarg, addr, sizeof addr, &cfg.port); break;
        case 's':
            if (n_sockets == GW_MAX_DAEMONS) {
                fprintf(stderr, "ringlm-gateway: at most %d --socket\n", GW_MAX_DAEMONS);
                return 2;
            }
            sockets[n_sockets++] = optarg;
            break;
        case 'F':
            cfg.affinity_block_tokens =
                (uint32_t)parse_num("--affinity-block-tokens", optarg, 1, 65536);
            break;
        case 't': tok_path = optarg; break;
        case 'k': keys_path = optarg; break;
        case 'c': tpl_name = optarg; break;
        case 'R':
            cfg.reasoning = gw_reason_by_name(optarg);
            if (cfg.reasoning < 0) {
                fprintf(stderr,
                        "ringlm-gateway: unknown --reasoning-parser '%s' (known: deepseek_r1, "
                        "qwen3)\n",
                        optarg);
                return 2;
            }
            break;
        case 'U':
            tool_parser_name = optarg;
            if (strcmp(optarg, "none") && gw_tool_parser_by_name(optarg) < 0) {
                fprintf(stderr,
                        "ringlm-gateway: unknown --tool-call-parser '%s' (known: hermes, "
                        "llama3_json, mistral, pythonic, none)\n",
                        optarg);
                return 2;
            }
            break;
        case 'm':
            if (!*optarg) {
                fprintf(stderr, "ringlm-gateway: --served-model-name is empty\n");
                return 2;
            }
            cfg.served_model = optarg;
            break;
        case 'L':
            cfg.max_model_len = (uint32_t)parse_num("--max-model-len", optarg, 1, 1 << 24);
            break;
        case 'B':
            cfg.max_body_bytes = (size_t)parse_num("--max-body-bytes", optarg, 64, 1l << 30);
            break;
        case 'T':
            cfg.http_timeout_s = (unsigned)parse_num("--http-timeout-s", optarg, 1, 86400);
            break;
        case 'C':
            cfg.max_connections = (unsigned)parse_num("--max-connections", optarg, 1, 1 << 20);
            break;
        case 'A':
            cfg.max_connections_per_addr =
                (unsigned)parse_num("--max-connections-per-addr", optarg, 0, 1 << 20);
            break;
        case 'H':
            cfg.http_head_timeout_s =
                (unsigned)parse_num("--http-head-timeout-s", optarg, 0, 86400);
            break;
        case 'Y':
            cfg.http_body_timeout_s =
                (unsigned)parse_num("--http-body-timeout-s", optarg, 0, 86400);
            break;
        case 'M':
            if (n_dmetrics == GW_MAX_DAEMONS) {
                fprintf(stderr, "ringlm-gateway: at most %d --daemon-metrics\n", GW_MAX_DAEMONS);
                return 2;
            }
            dmetrics[n_dmetrics++] = optarg;
            break;
        case 'P':
            cfg.prep_threads = (unsigned)parse_num("--tokenize-threads", optarg, 1, 256);
            break;
        case 'Q':
            cfg.prep_queue = (unsigned)parse_num("--tokenize-queue", optarg, 0, 1 << 20);
            break;
        case 'S': cfg.sessions = (unsigned)parse_num("--sessions", optarg, 1, 64); break;
        case 'g': grace_ms = parse_num("--drain-grace-ms", optarg, 0, 3600000); break;
        case 'q': cfg.quiet = 1; break;
        case 'V': printf("ringlm-gateway %s\n", RINGLM_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ringlm-gateway: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    cfg.listen_addr = addr;
    int t = tpl_name ? ringlm_chat_template_by_name(tpl_name) : RINGLM_CHAT_PLAIN;
    if (t < 0) {
        fprintf(stderr, "ringlm-gateway: unknown --chat-template '%s' (known: %s)\n", tpl_name,
                ringlm_chat_template_names());
        return 2;
    }
    cfg.tpl = t;
    const char *tpl_from = tpl_name ? "--chat-template" : "default";
    ringlm_chat_jinja *jinja = NULL;
    if (tok_path && !tpl_name && is_gguf(tok_path)) {
        int jr = ringlm_chat_jinja_load(tok_path, &jinja);
        if (jr < 0 && jr != -ENOENT) {
            fprintf(stderr, "ringlm-gateway: %s\n", ringlm_errdetail());
            return 1;
        }
        cfg.jinja = jinja;
        if (jinja) tpl_from = "the model file's chat_template";
    }
    if (tok_path && tpl_name && model_template(tok_path, tpl_name, &cfg.tpl, &tpl_from) < 0)
        return 1;
    /* tool calls: the syntax named, else the one the template writes */
    const char *tools_from = "--tool-call-parser";
    if (tool_parser_name)
        cfg.tool_parser = strcmp(tool_parser_name, "none")
                              ? gw_tool_parser_by_name(tool_parser_name)
                              : GW_TOOLS_NONE;
    else if (jinja) {
        cfg.tool_parser = gw_tool_parser_of_template(jinja);
        tools_from = "the chat template";
    } else {
        cfg.tool_parser = gw_tool_parser_of_builtin(cfg.tpl);
        tools_from = "the chat template";
    }

    ringlm_tokenizer *tok = NULL;
    if (tok_path) {
        int rc = ringlm_tokenizer_load(tok_path, 0, &tok);
        if (rc < 0) {
            fprintf(stderr, "ringlm-gateway: tokenizer %s: %s (%s)\n", tok_path, strerror(-rc),
                    ringlm_errdetail());
            return 1;
        }
        cfg.tok = tok;
        /* the model file's context, unless --max-model-len says */
        int ctx = ringlm_tokenizer_context_length(tok);
        if (!cfg.max_model_len && ctx > 0) cfg.max_model_len = (uint32_t)ctx;
    }
    gw_keys keys = {0};
    if (keys_path) {
        char why[256];
        int rc = gw_keys_load(keys_path, &keys, why, sizeof why);
        if (rc < 0) {
            fprintf(stderr, "ringlm-gateway: --api-keys %s\n", why);
            ringlm_tokenizer_free(tok);
            return 1;
        }
        cfg.keys = &keys;
    }

    /* Thousands of streams are thousands of sockets: the soft limit goes up to the hard
     * one, and the connection limit down to what that allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        /* besides connections: sessions (4 fds each), epoll, eventfds, files, stdio */
        rlim_t reserve = 64 + 4 * (rlim_t)cfg.sessions;
        rlim_t fit =
            rl.rlim_cur > reserve + GW_CUT_SLACK ? rl.rlim_cur - reserve - GW_CUT_SLACK : 1;
        if (rl.rlim_cur != RLIM_INFINITY && cfg.max_connections > fit) {
            fprintf(stderr,
                    "ringlm-gateway: --max-connections %u lowered to %llu: the open-file limit is "
                    "%llu (raise it with ulimit -n or LimitNOFILE=)\n",
                    cfg.max_connections, (unsigned long long)fit, (unsigned long long)rl.rlim_cur);
            cfg.max_connections = (unsigned)fit;
        }
    }
    /* Every thread started below inherits this mask: only sigwait below sees them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    cfg.daemon_metrics = dmetrics;
    cfg.n_daemon_metrics = n_dmetrics;
    if (n_sockets == 1) cfg.socket_path = sockets[0];
    if (n_sockets > 1) {
        cfg.sockets = sockets;
        cfg.n_sockets = n_sockets;
    }
    gw_server *s;
    int rc = gw_server_start(&cfg, &s);
    if (rc < 0) {
        gw_keys_free(&keys);
        ringlm_tokenizer_free(tok);
        return 1;
    }
    fprintf(stderr,
            "ringlm-gateway: listening on http://%s%s%s:%u (model '%s', template %s (%s), tool "
            "calls %s (%s), %s)\n",
            strchr(addr, ':') ? "[" : "", addr, strchr(addr, ':') ? "]" : "",
            (unsigned)gw_server_port(s), cfg.served_model ? cfg.served_model : "the daemon's",
            jinja ? "jinja" : ringlm_chat_template_name(cfg.tpl), tpl_from,
            gw_tool_parser_name(cfg.tool_parser), tools_from,
            keys_path ? "API keys required" : "no API keys: every request is this uid's tenant");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    if (!cfg.quiet) fprintf(stderr, "ringlm-gateway: %s: draining\n", strsignal(sig));
    gw_server_drain(s, (unsigned)grace_ms);
    if (gw_server_stop(s) < 0) return 0; /* a thread still uses tok and keys: only exit */
    gw_keys_free(&keys);
    ringlm_tokenizer_free(tok);
    ringlm_chat_jinja_free(jinja);
    if (!cfg.quiet) fprintf(stderr, "ringlm-gateway: drained; exiting\n");
    return 0;
}
