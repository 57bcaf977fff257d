/* SPDX-License-Identifier: MIT */
/*
 * model/ tokenizer: run.c's encode on the recorded oracle, run.c's decode rules, malformed
 * tokenizer files (clear errors, never a crash), and the heap merge against the quadratic
 * merge it replaced (tests/tok_reference.h) on random, long and degenerate texts.
 */
#include "model/tokenizer.h"
#include "tests/tok_reference.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/helpers.h"

static const char *shared_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/models/%s", th_shared_dir(), name);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

static tok_tokenizer *load_tok512(void)
{
    char path[1024];
    if (!shared_path(path, sizeof path, "tok512.bin"))
        cr_skip_test("no tok512.bin: set RINGLM_SHARED to the folder holding models/");
    tok_tokenizer *t;
    int err = tok_load(path, 512, &t);
    cr_assert_eq(err, 0, "tok_load: %d %s", err, tok_errmsg());
    return t;
}

Test(tokenizer, encode_oracle_cases)
{
    tok_tokenizer *t = load_tok512();
    char path[1024];
    cr_assert_not_null(shared_path(path, sizeof path, "reference-greedy.json"));
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    cr_assert_not_null(root, "%s", jerr.text);
    json_t *cases = json_object_get(json_object_get(root, "tokenizer_encode_oracle"), "cases");
    cr_assert_geq(json_array_size(cases), 10);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "tokens");
        int32_t got[256];
        int n = tok_encode(t, text, true, false, got, 256);
        cr_assert_eq(n, (int)json_array_size(want), "\"%s\": %d tokens, oracle %zu (%s)", text, n,
                     json_array_size(want), tok_errmsg());
        for (int k = 0; k < n; k++)
            cr_assert_eq(got[k], json_integer_value(json_array_get(want, (size_t)k)),
                         "\"%s\": token %d is %d, oracle %lld", text, k, got[k],
                         (long long)json_integer_value(json_array_get(want, (size_t)k)));
    }
    json_decref(root);
    tok_free(t);
}

Test(tokenizer, encode_flags_and_buffer)
{
    tok_tokenizer *t = load_tok512();
    int32_t out[64];
    cr_assert_eq(tok_encode(t, "", false, false, out, 64), 0, "empty text, no BOS: nothing");
    int n = tok_encode(t, "Once upon a time", true, true, out, 64);
    cr_assert_eq(n, 6);
    cr_assert_eq(out[0], TOK_BOS);
    cr_assert_eq(out[5], TOK_EOS);
    cr_assert_eq(tok_encode(t, "Once upon a time", true, true, out, 5), -ENOSPC);
    cr_assert_eq(tok_encode(t, NULL, true, false, out, 64), -EINVAL);
    tok_free(t);
}

/* Every rule of run.c's decode + safe_printf. */
Test(tokenizer, decode_rules)
{
    tok_tokenizer *t = load_tok512();
    cr_assert_str_eq(tok_piece(t, 410), " ");
    cr_assert_str_eq(tok_piece(t, 259), " t");
    cr_assert_str_eq(tok_decode(t, 5, 259), " t", "a piece keeps its space");
    cr_assert_str_eq(tok_decode(t, TOK_BOS, 259), "t", "after BOS the leading space goes");
    cr_assert_str_eq(tok_decode(t, TOK_BOS, 410), "", "a lone space after BOS is empty");
    cr_assert_str_eq(tok_decode(t, 5, 0x41 + 3), "A", "<0x41> is the raw byte A");
    cr_assert_str_eq(tok_decode(t, 5, 0x0A + 3), "\n", "<0x0A> is a newline (whitespace)");
    cr_assert_str_eq(tok_decode(t, 5, 0x01 + 3), "", "<0x01> is not printable: skipped");
    cr_assert_str_eq(tok_decode(t, 5, 0xC3 + 3), "", "a lone UTF-8 lead byte is skipped");
    cr_assert_str_eq(tok_decode(t, 5, 0x00 + 3), "", "<0x00> prints nothing");
    cr_assert_null(tok_decode(t, 5, 512));
    cr_assert_null(tok_decode(t, 5, -1));
    tok_free(t);
}

/* ---- malformed files ------------------------------------------------------------------ */

static void put_i32(unsigned char **p, int32_t v)
{
    memcpy(*p, &v, 4);
    *p += 4;
}

/* A valid 4-token file: unk, BOS, EOS, "a". */
static size_t good_file(unsigned char *buf)
{
    unsigned char *p = buf;
    const char *pieces[] = {"<unk>", "\n<s>\n", "\n</s>\n", "a"};
    put_i32(&p, 6);
    for (int i = 0; i < 4; i++) {
        float score = (float)-i;
        memcpy(p, &score, 4);
        p += 4;
        put_i32(&p, (int32_t)strlen(pieces[i]));
        memcpy(p, pieces[i], strlen(pieces[i]));
        p += strlen(pieces[i]);
    }
    return (size_t)(p - buf);
}

Test(tokenizer, malformed_files_get_clear_errors)
{
    unsigned char buf[256];
    size_t len = good_file(buf);
    tok_tokenizer *t;
    cr_assert_eq(tok_load_mem(buf, len, 4, &t), 0, "%s", tok_errmsg());
    cr_assert_eq(tok_vocab_size(t), 4);
    tok_free(t);
    cr_assert_eq(tok_load_mem(buf, len, 0, &t), 0, "vocab 0 reads to the end: %s", tok_errmsg());
    cr_assert_eq(tok_vocab_size(t), 4);
    tok_free(t);

    struct {
        const char *what;
        size_t len;
        int vocab;
        int patch_off;
        int32_t patch;
        const char *needle;
    } cases[] = {
        {"empty file", 0, 4, -1, 0, "max_token_length"},
        {"header only, vocab 4", 4, 4, -1, 0, "token 0"},
        {"truncated inside a piece", len - 1, 4, -1, 0, "runs past the end"},
        {"more tokens asked than present", len, 5, -1, 0, "token 4"},
        {"fewer tokens asked than present", len, 3, -1, 0, "bytes after token 2"},
        {"negative piece length", len, 4, 8, -5, "piece length -5"},
        {"huge piece length", len, 4, 8, 1 << 30, "piece length"},
        {"zero max_token_length", len, 4, 0, 0, "max_token_length=0"},
        {"negative vocab", len, -1, -1, 0, "vocab_size=-1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char b2[256];
        memcpy(b2, buf, len);
        if (cases[i].patch_off >= 0) memcpy(b2 + cases[i].patch_off, &cases[i].patch, 4);
        t = (tok_tokenizer *)0x1;
        int err = tok_load_mem(b2, cases[i].len, cases[i].vocab, &t);
        cr_assert_eq(err, -EINVAL, "%s: got %d (%s)", cases[i].what, err, tok_errmsg());
        cr_assert_null(t, "%s: no tokenizer on error", cases[i].what);
        cr_assert(strstr(tok_errmsg(), cases[i].needle), "%s: message \"%s\" lacks \"%s\"",
                  cases[i].what, tok_errmsg(), cases[i].needle);
    }
    cr_assert_eq(tok_load("/nonexistent/tok.bin", 4, &t), -ENOENT);
}

Test(tokenizer, byte_fallback_outside_vocab_is_an_error)
{
    unsigned char buf[256];
    size_t len = good_file(buf);
    tok_tokenizer *t;
    cr_assert_eq(tok_load_mem(buf, len, 4, &t), 0);
    int32_t out[16];
    int n = tok_encode(t, "a", true, false, out, 16);
    cr_assert_eq(n, 2, "BOS + 'a' (no ' ' piece, so no dummy prefix): %d %s", n, tok_errmsg());
    cr_assert_eq(out[1], 3);
    cr_assert_eq(tok_encode(t, "b", true, false, out, 16), -EINVAL, "byte 'b' has no token");
    cr_assert(strstr(tok_errmsg(), "0x62"), "%s", tok_errmsg());
    tok_free(t);
}

/* run.c's encode written out naively (linear lookups, every pair re-looked-up after each
 * merge), to check the optimised one on many random texts. */
static int32_t naive_lookup(const tok_tokenizer *t, const char *s)
{
    for (int i = 0; i < tok_vocab_size(t); i++)
        if (strcmp(tok_piece(t, i), s) == 0) return i;
    return -1;
}

static int naive_encode(const tok_tokenizer *t, const char *text, int32_t *tk)
{
    int n = 0;
    char buf[64];
    tk[n++] = TOK_BOS;
    if (text[0]) tk[n++] = naive_lookup(t, " ");
    size_t len = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;
        buf[len++] = (char)*c;
        buf[len] = 0;
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;
        int32_t id = naive_lookup(t, buf);
        if (id >= 0)
            tk[n++] = id;
        else
            for (size_t i = 0; i < len; i++) tk[n++] = (unsigned char)buf[i] + 3;
        len = 0;
    }
    for (;;) {
        float best = -1e10f;
        int bi = -1, bid = -1;
        for (int i = 0; i + 1 < n; i++) {
            snprintf(buf, sizeof buf, "%s%s", tok_piece(t, tk[i]), tok_piece(t, tk[i + 1]));
            int32_t id = naive_lookup(t, buf);
            if (id >= 0 && tok_score(t, id) > best) {
                best = tok_score(t, id);
                bi = i;
                bid = id;
            }
        }
        if (bi < 0) break;
        tk[bi] = bid;
        for (int i = bi + 1; i < n - 1; i++) tk[i] = tk[i + 1];
        n--;
    }
    return n;
}

Test(tokenizer, optimised_merge_equals_run_c_on_random_texts)
{
    tok_tokenizer *t = load_tok512();
    const char *alphabet[] = {"a", "e",  "t", " ", "o", "n", "h", "Lily", " the", ".",
                              ",", "\n", "é", "💩", "1", "x", "'", "!",    "  ",   "ing"};
    unsigned seed = 12345;
    for (int iter = 0; iter < 300; iter++) {
        char text[400] = "";
        int parts = 1 + iter % 40;
        for (int p = 0; p < parts; p++) {
            seed = seed * 1103515245u + 12345u;
            strcat(text, alphabet[(seed >> 16) % 20]);
        }
        int32_t a[512], b[512];
        int na = tok_encode(t, text, true, false, a, 512);
        int nb = naive_encode(t, text, b);
        cr_assert_eq(na, nb, "\"%s\": %d tokens vs run.c's %d", text, na, nb);
        cr_assert(memcmp(a, b, (size_t)na * 4) == 0, "\"%s\": ids differ from run.c's", text);
    }
    tok_free(t);
}

/* Random text from an alphabet of pieces, words and bytes that have no token (byte fallback). */
static char *random_text(unsigned *seed, size_t len)
{
    static const char *const alphabet[] = {
        "a",    "e",    "t",    " ",    "o",  "n",   "h",
        "Lily", " the", ".",    ",",    "\n", "é",   "💩",
        "1",    "x",    "'",    "!",    "  ", "ing", "Once upon a time",
        " and", "\t",   "\x01", "\xff", "Ω"};
    const size_t na = sizeof alphabet / sizeof alphabet[0];
    char *s = malloc(len + 32);
    size_t n = 0;
    while (n < len) {
        *seed = *seed * 1103515245u + 12345u;
        const char *p = alphabet[(*seed >> 16) % na];
        memcpy(s + n, p, strlen(p));
        n += strlen(p);
    }
    s[n] = '\0';
    return s;
}

static void assert_same_as_reference(const tok_tokenizer *t, const char *what, const char *text)
{
    int cap = (int)tok_encode_bound(text);
    int32_t *a = malloc((size_t)cap * sizeof *a), *b = malloc((size_t)cap * sizeof *b);
    int na = tok_encode(t, text, true, true, a, cap);
    int nb = ref_encode(t, text, true, true, b, cap);
    cr_assert_gt(na, 0, "%s: %s", what, tok_errmsg());
    cr_assert_eq(na, nb, "%s (%zu bytes): %d tokens, the quadratic merge %d", what, strlen(text),
                 na, nb);
    for (int i = 0; i < na; i++)
        cr_assert_eq(a[i], b[i], "%s (%zu bytes): token %d is %d, the quadratic merge's %d", what,
                     strlen(text), i, a[i], b[i]);
    free(a);
    free(b);
}

/* The heap merges in the very order of the rescanning merge it replaced: on many random
 * texts, on long ones (where an off-by-one in the list or a stale heap entry would show),
 * and on degenerate ones (one repeated character: every pair ties, leftmost must win). */
Test(tokenizer, heap_merge_equals_the_quadratic_merge, .timeout = 120)
{
    tok_tokenizer *t = load_tok512();
    unsigned seed = 7;
    for (int iter = 0; iter < 400; iter++) {
        char *text = random_text(&seed, 1 + (size_t)(seed >> 8) % 300);
        assert_same_as_reference(t, "random text", text);
        free(text);
    }
    for (size_t len = 4096; len <= 32768; len *= 2) {
        char *text = random_text(&seed, len);
        assert_same_as_reference(t, "long random text", text);
        free(text);
    }
    static const char *const runs[] = {"a", " ", "e", "é", "ab", "aab", "\xff"};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        size_t l = strlen(runs[r]), count = 5000 / l + r;
        char *text = malloc(count * l + 1);
        for (size_t i = 0; i < count; i++) memcpy(text + i * l, runs[r], l);
        text[count * l] = '\0';
        assert_same_as_reference(t, runs[r], text);
        free(text);
    }
    tok_free(t);
}

/* The merge is O(n log n): 1 MiB of text (the gateway's body limit) encodes in well under a
 * second where the quadratic merge took minutes (perf/tok_bench.c has the figures). The bound
 * is loose for a loaded machine: a quadratic merge misses it by two orders of magnitude. */
Test(tokenizer, a_megabyte_prompt_encodes_in_seconds, .timeout = 120)
{
    tok_tokenizer *t = load_tok512();
    unsigned seed = 11;
    char *text = random_text(&seed, 1 << 20);
    int cap = (int)tok_encode_bound(text);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    uint64_t t0 = th_now_ms();
    int n = tok_encode(t, text, true, false, ids, cap);
    double ms = (double)(th_now_ms() - t0);
    cr_assert_gt(n, 0, "%s", tok_errmsg());
    cr_log_info("1 MiB: %d tokens in %.0f ms", n, ms);
    cr_assert_lt(ms, 10000.0, "1 MiB encoded in %.0f ms", ms);
    free(ids);
    free(text);
    tok_free(t);
}
