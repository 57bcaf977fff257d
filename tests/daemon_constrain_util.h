/* SPDX-License-Identifier: MIT */
/*
 * tests/daemon_constrain_util.h — what the constrained-output suites through a real ringlmd
 * (tests/test_daemon_constrain.c, tests/test_daemon_nseq_constrain.c) share (header only, so
 * it is not linked into every test program): the daemon serving stories260K with its
 * tokenizer tok512 and a client connected to it, the story prompt, the bias that keeps a tiny
 * model out of JSON's whitespace; an answer's text as the constraint saw it; and the check
 * of answers by Debian's python3 (python3-jsonschema for schemas, re for regexes), which
 * tests/test_gateway_constrain.c shares.
 */
#ifndef RINGLM_TESTS_DAEMON_CONSTRAIN_UTIL_H
#define RINGLM_TESTS_DAEMON_CONSTRAIN_UTIL_H

#include <criterion/criterion.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "tests/daemon_helpers.h"
#include "tests/helpers.h"

typedef struct dcu_env {
    dmn d;
    char model[512], tok[512];
    ringlm_client *c;
    ringlm_tokenizer *t;
    int32_t prompt[64]; /* "Once upon a time" after BOS */
    uint32_t n_prompt;
    /* -100 on every token that is only whitespace: JSON lets whitespace in anywhere, and a
     * 260K-parameter model sampled at temperature 1 wanders there for ever; with this, most
     * answers finish within their budget */
    ringlm_logit_bias no_ws[RINGLM_MAX_LOGIT_BIAS];
    uint32_t n_no_ws;
    bool use_no_ws; /* the suite's own switch: whether its requests carry no_ws */
} dcu_env;

/* Starts ringlmd on stories260K (with tok512 as its tokenizer when with_tokenizer), connects,
 * loads tok512 here and tokenizes the prompt. Skips the test when a file is absent. */
static inline void dcu_env_start(dcu_env *e, bool with_tokenizer)
{
    memset(e, 0, sizeof *e);
    need_daemon_binary();
    if (!stories_path(e->model, sizeof e->model))
        cr_skip_test("stories260K.bin not in %s/models", th_shared_dir());
    snprintf(e->tok, sizeof e->tok, "%s/models/tok512.bin", th_shared_dir());
    if (access(e->tok, R_OK) != 0) cr_skip_test("tok512.bin not in %s/models", th_shared_dir());
    const char *extra[] = {"--tokenizer", e->tok, NULL};
    dmn_start(&e->d, e->model, NULL, with_tokenizer ? extra : NULL);
    cr_assert_eq(ringlm_connect(e->d.sock, &e->c), 0, "connect: %s", ringlm_errdetail());
    cr_assert_eq(ringlm_tokenizer_load(e->tok, 512, &e->t), 0, "%s", ringlm_errdetail());
    int n = ringlm_tokenize(e->t, "Once upon a time", 1 /* BOS */, e->prompt, 64);
    cr_assert_gt(n, 1, "%s", ringlm_errdetail());
    e->n_prompt = (uint32_t)n;
    for (int32_t id = 0; id < 512; id++) {
        const char *p;
        if (ringlm_token_text(e->t, 3, id, &p) < 0 || !*p || strspn(p, " \t\r\n") != strlen(p))
            continue;
        e->no_ws[e->n_no_ws++] = (ringlm_logit_bias){id, -100.0f};
    }
}

/* Closes the client, checks that every request and KV block is gone and stops the daemon (its
 * logs are complete then); dcu_env_stop also removes its directory. */
static inline void dcu_env_halt(dcu_env *e)
{
    ringlm_close(e->c);
    e->c = NULL;
    ringlm_tokenizer_free(e->t);
    e->t = NULL;
    assert_back_to_baseline(&e->d, 10000);
    cr_expect_eq(dmn_stop(&e->d, SIGTERM, 10000), 0);
}

static inline void dcu_env_stop(dcu_env *e)
{
    dcu_env_halt(e);
    dmn_cleanup(&e->d);
}

/* The text of n generated tokens as the constraint saw it, into text (cap bytes): each
 * token's bytes after the one before it, the first after prev (the prompt's last token). */
static inline void dcu_answer_text(const dcu_env *e, int32_t prev, const int32_t *toks, uint32_t n,
                                   char *text, size_t cap)
{
    size_t at = 0;
    for (uint32_t k = 0; k < n; k++) {
        const char *p;
        cr_assert_eq(ringlm_token_text(e->t, prev, toks[k], &p), 0);
        size_t l = strlen(p);
        cr_assert_lt(at + l, cap);
        memcpy(text + at, p, l);
        at += l;
        prev = toks[k];
    }
    text[at] = 0;
}

/* Writes a string as a JSON string literal (the text may hold any byte but NUL). */
static inline void dcu_put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Runs the checks in Python (Debian's python3 and python3-jsonschema) over `lines`, one JSON
 * object a line: {"mode": "schema" | "regex" | "choice", "c": the schema | the pattern (a
 * string) | the choices (a list), "text": the answer}, written to dir with the script.
 * Prints each failure; *n_checked: the lines checked. Returns how many failed. */
static inline int dcu_py_check_lines(const char *dir, const char *lines, int *n_checked)
{
    if (access("/usr/bin/python3", X_OK) != 0) cr_skip_test("/usr/bin/python3 not installed");
    char path[512], script[512];
    snprintf(path, sizeof path, "%s/answers.jsonl", dir);
    snprintf(script, sizeof script, "%s/check.py", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(lines, f);
    fclose(f);
    f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs("import json, re, sys\n"
          "import jsonschema\n"
          "bad = n = 0\n"
          "for line in open(sys.argv[1]):\n"
          "    r = json.loads(line)\n"
          "    n += 1\n"
          "    try:\n"
          "        if r['mode'] == 'schema':\n"
          "            jsonschema.validate(json.loads(r['text']), r['c'])\n"
          "        elif r['mode'] == 'regex':\n"
          "            assert re.fullmatch(r['c'], r['text']), 'no match'\n"
          "        else:\n"
          "            assert r['text'] in r['c'], 'not a choice'\n"
          "    except Exception as ex:\n"
          "        bad += 1\n"
          "        print('FAIL', repr(r['text']), 'against', json.dumps(r['c'])[:100], ':',\n"
          "              str(ex)[:200])\n"
          "print('checked', n, 'bad', bad)\n",
          f);
    fclose(f);
    char *out = NULL, *err = NULL;
    char *argv[] = {"/usr/bin/python3", script, path, NULL};
    cr_assert_eq(th_run(argv, &out, &err, 120), 0, "python3: %s %s", out ? out : "",
                 err ? err : "");
    int n = -1, bad = -1;
    const char *p = strstr(out, "checked ");
    if (p) sscanf(p, "checked %d bad %d", &n, &bad);
    if (bad) fprintf(stderr, "%s", out);
    *n_checked = n;
    free(out);
    free(err);
    return bad;
}

/* Checks answer texts[i] against constraint cons[i] (dcu_py_check_lines in the daemon's
 * directory), skipping a NULL text: mode "schema" (cons[i] a schema's JSON text), "regex", or
 * "choice" (lens given: cons[i] holds the choices, NUL-separated, in lens[i] bytes). Returns
 * how many failed. */
static inline int dcu_py_check(const dcu_env *e, const char *mode, const char *const *cons,
                               const size_t *lens, const char *const *texts, int n)
{
    char *lines = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&lines, &size);
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        if (!texts[i]) continue;
        fprintf(f, "{\"mode\": \"%s\", \"c\": ", mode);
        if (lens) { /* choices: NUL-separated, as a JSON list */
            fputc('[', f);
            for (size_t at = 0; at <= lens[i];) {
                dcu_put_json_string(f, cons[i] + at);
                at += strlen(cons[i] + at) + 1;
                if (at <= lens[i]) fputc(',', f);
            }
            fputc(']', f);
        } else if (!strcmp(mode, "schema")) {
            fputs(cons[i], f); /* the schema itself */
        } else {
            dcu_put_json_string(f, cons[i]);
        }
        fputs(", \"text\": ", f);
        dcu_put_json_string(f, texts[i]);
        fputs("}\n", f);
    }
    fclose(f);
    int checked, bad = dcu_py_check_lines(e->d.dir, lines, &checked);
    free(lines);
    return bad;
}

#endif
