/* SPDX-License-Identifier: MIT */
/*
 * The tokenizer API that libringlm.so exports (ringlm_tokenizer_load, ringlm_tokenize,
 * ringlm_token_text, ringlm_detokenize, ...), called through the shared library itself
 * (dlopen of build/lib/libringlm.so, as a C client links it): the ids equal the daemon's own
 * tokenizer's (model/tokenizer.h, linked into this test) and run.c's recorded ones for the
 * stories260K prompts, the recorded texts come back from their ids, and bad input (a missing
 * or truncated file, NULL, a buffer too small, an id outside the vocabulary) gives -errno
 * with a detail.
 */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libclient/ringlm.h"
#include "model/tokenizer.h"
#include "tests/helpers.h"

/* The library's functions, looked up by name: a test of what the .so exports. */
static struct {
    void *h;
    int (*load)(const char *, int, ringlm_tokenizer **);
    void (*free_)(ringlm_tokenizer *);
    int (*vocab_size)(const ringlm_tokenizer *);
    int32_t (*bos)(const ringlm_tokenizer *), (*eos)(const ringlm_tokenizer *),
        (*eot)(const ringlm_tokenizer *);
    size_t (*bound)(const char *);
    int (*tokenize)(const ringlm_tokenizer *, const char *, unsigned, int32_t *, size_t);
    int (*token_text)(const ringlm_tokenizer *, int32_t, int32_t, const char **);
    int (*detokenize)(const ringlm_tokenizer *, const int32_t *, size_t, char *, size_t);
    int (*add_special)(const ringlm_tokenizer *);
    const char *(*errdetail)(void);
} so;

#define SYM(field, name)                                                                           \
    do {                                                                                           \
        *(void **)&so.field = dlsym(so.h, name);                                                   \
        cr_assert_not_null(so.field, "libringlm.so does not export %s", name);                     \
    } while (0)

static void open_so(void)
{
    char p[4096];
    const char *b = getenv("RINGLM_BUILD");
    snprintf(p, sizeof p, "%s/lib/libringlm.so", b && *b ? b : "build");
    if (access(p, R_OK) != 0) cr_skip_test("%s not built (set RINGLM_BUILD)", p);
    so.h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(so.h, "%s", dlerror());
    SYM(load, "ringlm_tokenizer_load");
    SYM(free_, "ringlm_tokenizer_free");
    SYM(vocab_size, "ringlm_tokenizer_vocab_size");
    SYM(bos, "ringlm_tokenizer_bos");
    SYM(eos, "ringlm_tokenizer_eos");
    SYM(eot, "ringlm_tokenizer_eot");
    SYM(bound, "ringlm_tokenize_bound");
    SYM(tokenize, "ringlm_tokenize");
    SYM(token_text, "ringlm_token_text");
    SYM(detokenize, "ringlm_detokenize");
    SYM(add_special, "ringlm_tokenizer_add_special");
    SYM(errdetail, "ringlm_errdetail");
}

static void close_so(void)
{
    if (so.h) dlclose(so.h);
    memset(&so, 0, sizeof so);
}

TestSuite(libclient_tokenize, .init = open_so, .fini = close_so);

static char *tok512_path(void)
{
    return th_shared_file("models/tok512.bin");
}

static json_t *reference(void)
{
    char *p = th_shared_file("models/reference-greedy.json");
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    cr_assert_not_null(root, "%s: %s", p, je.text);
    free(p);
    return root;
}

/* ids of text through the library, checked against the internal tokenizer's */
static int both_encode(ringlm_tokenizer *lt, tok_tokenizer *it, const char *text, int32_t *ids,
                       size_t max)
{
    int32_t *want = malloc(max * sizeof *want);
    int n = so.tokenize(lt, text, RINGLM_TOKENIZE_BOS, ids, max);
    cr_assert_geq(n, 0, "ringlm_tokenize \"%s\": %d %s", text, n, so.errdetail());
    int m = tok_encode(it, text, true, false, want, (int)max);
    cr_assert_eq(n, m, "\"%s\": %d ids from libringlm.so, %d from model/", text, n, m);
    cr_assert(memcmp(ids, want, (size_t)n * sizeof *ids) == 0, "\"%s\": ids differ", text);
    free(want);
    return n;
}

static void assert_ids(const char *text, const int32_t *ids, int n, json_t *want)
{
    cr_assert_eq((size_t)n, json_array_size(want), "\"%s\": %d ids, run.c %zu", text, n,
                 json_array_size(want));
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], json_integer_value(json_array_get(want, (size_t)i)),
                     "\"%s\": id %d is %d, run.c's %lld", text, i, ids[i],
                     (long long)json_integer_value(json_array_get(want, (size_t)i)));
}

static void assert_round_trip(ringlm_tokenizer *lt, const char *text, const int32_t *ids, int n)
{
    int len = so.detokenize(lt, ids, (size_t)n, NULL, 0);
    cr_assert_eq(len, (int)strlen(text), "\"%s\": measured %d bytes (%s)", text, len,
                 so.errdetail());
    char *buf = malloc((size_t)len + 1);
    cr_assert_eq(so.detokenize(lt, ids, (size_t)n, buf, (size_t)len + 1), len);
    cr_assert_str_eq(buf, text);
    free(buf);
}

Test(libclient_tokenize, stories260k_prompts_match_the_internal_tokenizer_and_run_c)
{
    char *path = tok512_path();
    ringlm_tokenizer *lt;
    tok_tokenizer *it;
    cr_assert_eq(so.load(path, 512, &lt), 0, "%s", so.errdetail());
    cr_assert_eq(tok_load(path, 512, &it), 0, "%s", tok_errmsg());
    cr_assert_eq(so.vocab_size(lt), 512);
    cr_assert_eq(so.bos(lt), 1);
    cr_assert_eq(so.eos(lt), 2);
    cr_assert_eq(so.eot(lt), -1, "llama2.c files name no end of turn");
    json_t *root = reference();
    int compared = 0;
    /* the encode oracle's texts: run.c's ids, and the text back from them */
    json_t *cases = json_object_get(json_object_get(root, "tokenizer_encode_oracle"), "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t max = so.bound(text);
        int32_t *ids = malloc(max * sizeof *ids);
        int n = both_encode(lt, it, text, ids, max);
        assert_ids(text, ids, n, json_object_get(c, "tokens"));
        if (text[0] != ' ') assert_round_trip(lt, text, ids, n);
        free(ids);
        compared++;
    }
    /* the greedy cases: the prompt's ids, and the text run.c printed for prompt + output */
    json_t *greedy = json_object_get(root, "cases");
    for (size_t i = 0; i < json_array_size(greedy); i++) {
        json_t *c = json_array_get(greedy, i);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        size_t max = so.bound(prompt);
        int32_t *ids = malloc(max * sizeof *ids);
        int n = both_encode(lt, it, prompt, ids, max);
        assert_ids(prompt, ids, n, json_object_get(c, "prompt_tokens"));
        if (prompt[0] != ' ') assert_round_trip(lt, prompt, ids, n);
        free(ids);
        compared++;
    }
    cr_log_info("%d texts compared", compared);
    cr_assert_geq(compared, 10);
    json_decref(root);
    tok_free(it);
    so.free_(lt);
    free(path);
}

/* A generation printed token by token equals the whole sequence decoded at once. */
Test(libclient_tokenize, token_by_token_equals_the_whole_sequence)
{
    char *path = tok512_path();
    ringlm_tokenizer *lt;
    cr_assert_eq(so.load(path, 0, &lt), 0, "%s", so.errdetail());
    json_t *root = reference();
    json_t *greedy = json_object_get(root, "cases");
    for (size_t i = 0; i < json_array_size(greedy); i++) {
        json_t *c = json_array_get(greedy, i), *p = json_object_get(c, "prompt_tokens"),
               *g = json_object_get(c, "generated_tokens");
        size_t n = json_array_size(p) + json_array_size(g);
        int32_t *ids = malloc(n * sizeof *ids);
        for (size_t k = 0; k < n; k++)
            ids[k] = (int32_t)json_integer_value(k < json_array_size(p)
                                                     ? json_array_get(p, k)
                                                     : json_array_get(g, k - json_array_size(p)));
        size_t cap = 1 << 16, used = 0;
        char *one = malloc(cap);
        one[0] = '\0';
        for (size_t k = 1; k < n; k++) { /* ids[0] is BOS: printed as nothing */
            const char *s;
            cr_assert_eq(so.token_text(lt, ids[k - 1], ids[k], &s), 0, "%s", so.errdetail());
            size_t l = strlen(s);
            cr_assert_lt(used + l, cap);
            memcpy(one + used, s, l + 1);
            used += l;
        }
        char *whole = malloc(cap);
        int len = so.detokenize(lt, ids, n, whole, cap);
        cr_assert_geq(len, 0, "%s", so.errdetail());
        cr_assert_str_eq(whole, one, "case %zu", i);
        free(one);
        free(whole);
        free(ids);
    }
    json_decref(root);
    so.free_(lt);
    free(path);
}

/* Bad input: -errno and a detail that says what is wrong; nothing crashes. */
Test(libclient_tokenize, bad_input_gives_an_errno_and_a_detail)
{
    ringlm_tokenizer *lt = (ringlm_tokenizer *)1;
    cr_assert_eq(so.load("/nonexistent/tok.bin", 0, &lt), -ENOENT);
    cr_assert_null(lt, "*out is NULL after a failure");
    cr_assert(strstr(so.errdetail(), "/nonexistent/tok.bin"), "%s", so.errdetail());
    cr_assert_eq(so.load(NULL, 0, &lt), -EINVAL);
    cr_assert_eq(so.load("x", 0, NULL), -EINVAL);
    cr_assert_eq(so.load("x", -1, &lt), -EINVAL);
    cr_assert(strstr(so.errdetail(), "vocab_size"), "%s", so.errdetail());

    /* a truncated copy of tok512.bin */
    char *path = tok512_path();
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    static unsigned char buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(got, 1000u);
    char cut[] = "/tmp/ringlm-tok-cut-XXXXXX";
    int fd = mkstemp(cut);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, buf, got / 2), (ssize_t)(got / 2));
    close(fd);
    cr_assert_eq(so.load(cut, 512, &lt), -EINVAL, "a truncated file is refused");
    cr_assert(strstr(so.errdetail(), cut) && strstr(so.errdetail(), "token"), "%s", so.errdetail());
    cr_assert_eq(so.load(path, 511, &lt), -EINVAL, "a file of another vocabulary size");
    unlink(cut);

    cr_assert_eq(so.load(path, 512, &lt), 0, "%s", so.errdetail());
    int32_t ids[8];
    const char *s;
    cr_assert_eq(so.tokenize(NULL, "a", 0, ids, 8), -EINVAL);
    cr_assert(strstr(so.errdetail(), "NULL"), "%s", so.errdetail());
    cr_assert_eq(so.tokenize(lt, NULL, 0, ids, 8), -EINVAL);
    cr_assert_eq(so.tokenize(lt, "a", 0, NULL, 8), -EINVAL);
    cr_assert_eq(so.tokenize(lt, "a", 8, ids, 8), -EINVAL, "unknown flag");
    cr_assert(strstr(so.errdetail(), "flags"), "%s", so.errdetail());
    cr_assert_eq(so.tokenize(lt, "", 0, NULL, 0), 0, "nothing to encode, no room needed");
    cr_assert_eq(so.tokenize(lt, "Once upon a time, there was", RINGLM_TOKENIZE_BOS, ids, 3),
                 -ENOSPC);
    cr_assert(strstr(so.errdetail(), "tokens"), "%s", so.errdetail());
    int n = so.tokenize(lt, "Once", RINGLM_TOKENIZE_BOS | RINGLM_TOKENIZE_EOS, ids, 8);
    cr_assert_geq(n, 3, "%s", so.errdetail());
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[n - 1], 2);
    /* a llama2.c tokenizer: RINGLM_TOKENIZE_SPECIAL adds BOS, as run.c */
    cr_assert_eq(so.add_special(lt), (int)RINGLM_TOKENIZE_BOS);
    cr_assert_eq(so.add_special(NULL), -EINVAL);
    int32_t sp[8];
    cr_assert_eq(so.tokenize(lt, "Once", RINGLM_TOKENIZE_SPECIAL, sp, 8), n - 1);
    cr_assert_arr_eq(sp, ids, (size_t)(n - 1) * sizeof *ids);
    cr_assert_eq(so.token_text(lt, -1, 512, &s), -EINVAL);
    cr_assert(strstr(so.errdetail(), "512"), "%s", so.errdetail());
    cr_assert_eq(so.token_text(lt, -1, -3, &s), -EINVAL);
    cr_assert_eq(so.token_text(lt, -1, 5, NULL), -EINVAL);
    cr_assert_eq(so.token_text(NULL, -1, 5, &s), -EINVAL);
    int32_t bad[] = {1, 300, 9999};
    char out[64];
    cr_assert_eq(so.detokenize(lt, bad, 3, out, sizeof out), -EINVAL);
    cr_assert(strstr(so.errdetail(), "ids[2]") && strstr(so.errdetail(), "9999"), "%s",
              so.errdetail());
    cr_assert_eq(so.detokenize(lt, NULL, 3, out, sizeof out), -EINVAL);
    cr_assert_eq(so.detokenize(lt, ids, 4, NULL, 8), -EINVAL);
    int len = so.detokenize(lt, ids, (size_t)n, NULL, 0);
    cr_assert_eq(len, 4, "\"Once\" measured as %d bytes", len);
    cr_assert_eq(so.detokenize(lt, ids, (size_t)n, out, 4), -ENOSPC, "4 bytes and a NUL need 5");
    cr_assert(strstr(so.errdetail(), "needs 5"), "%s", so.errdetail());
    cr_assert_str_eq(out, "Onc", "cut to the buffer, NUL-terminated");
    cr_assert_eq(so.detokenize(lt, ids, (size_t)n, out, 5), 4);
    cr_assert_str_eq(out, "Once");
    cr_assert_eq(so.vocab_size(NULL), -EINVAL);
    cr_assert_eq(so.bos(NULL), -EINVAL);
    so.free_(NULL);
    so.free_(lt);
    free(path);
}
