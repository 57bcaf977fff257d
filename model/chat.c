/* SPDX-License-Identifier: MIT */
/*
 * model/chat.c — the built-in chat templates (no Jinja engine) and the matching of a
 * model file's Jinja template (tokenizer.chat_template) to one of them. See chat.h for
 * the shapes. Where the real templates trim the content (Llama 3's `| trim`, Llama 2's
 * `.strip()`), so do these, with JavaScript's String.trim whitespace (@huggingface/jinja's,
 * the oracle in tests/test_gguf_vocab.c).
 */
#include "model/chat.h"
#include "model/gguf.h"
#include "model/jinja.h"
#include "common/errdetail.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ERRDETAIL_DEFINE(chat_err);

const char *chat_errmsg(void)
{
    return chat_err.msg;
}

#define chat_seterr(...) errdetail_set(&chat_err, __VA_ARGS__)

static const struct {
    const char *name;
    int t;
} names[] = {
    {"plain", CHAT_PLAIN},           {"chatml", CHAT_CHATML},
    {"llama2", CHAT_LLAMA2},         {"llama-2", CHAT_LLAMA2},
    {"llama3", CHAT_LLAMA3},         {"llama-3", CHAT_LLAMA3},
    {"mistral", CHAT_MISTRAL},       {"mistral-v1", CHAT_MISTRAL_V1},
    {"mistral-v3", CHAT_MISTRAL_V3}, {"mistral-v3-tekken", CHAT_MISTRAL_V3_TEKKEN},
    {"mistral-v7", CHAT_MISTRAL_V7},
};

int chat_template_by_name(const char *name)
{
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (!strcmp(names[i].name, name)) return names[i].t;
    return chat_seterr(-EINVAL, "chat template '%s': unknown (%s)", name ? name : "(null)",
                       chat_template_names());
}

const char *chat_template_name(int t)
{
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].t == t) return names[i].name;
    return "?";
}

const char *chat_template_names(void)
{
    return "chatml, llama2, llama3, mistral, mistral-v1, mistral-v3, mistral-v3-tekken, "
           "mistral-v7, plain";
}

/* ---- matching a Jinja template ---------------------------------------------------------- */

/* The markers each family's template spells (llama.cpp tells templates apart the same way):
 * <|im_start|> and <|im_end|> → chatml, <|start_header_id|> and <|eot_id|> → llama3, [INST]
 * and [/INST] → one of the [INST] family (inst_family); a template that spells none of these,
 * or the markers of more than one family, is unknown (never a guess). The rendering is
 * checked against the real templates in tests/test_gguf_vocab.c. */
static int inst_family(const char *jinja)
{
    if (strstr(jinja, "[SYSTEM_PROMPT]")) /* v7; its tekken form (no spaces) is not built in */
        return strstr(jinja, "'[INST] '") ? CHAT_MISTRAL_V7 : -ENOTSUP;
    if (strstr(jinja, "<<SYS>>")) return CHAT_LLAMA2;
    /* Mistral's later templates spell how the system message joins a user message */
    if (strstr(jinja, "' [INST] ' + system_message")) return CHAT_MISTRAL_V1;
    if (strstr(jinja, "\"[INST] \" + system_message")) return CHAT_MISTRAL_V3;
    if (strstr(jinja, "\"[INST]\" + system_message")) return CHAT_MISTRAL_V3_TEKKEN;
    if (strstr(jinja, "system_message") || strstr(jinja, "[AVAILABLE_TOOLS]"))
        return -ENOTSUP; /* a system message placed some other way */
    return CHAT_MISTRAL;
}

int chat_template_match(const char *jinja)
{
    if (!jinja) return chat_seterr(-EINVAL, "chat template: NULL");
    bool chatml = strstr(jinja, "<|im_start|>") && strstr(jinja, "<|im_end|>");
    bool llama3 = strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>");
    bool inst = strstr(jinja, "[INST]") && strstr(jinja, "[/INST]");
    int t = -ENOTSUP;
    if (chatml + llama3 + inst == 1)
        t = chatml ? CHAT_CHATML : llama3 ? CHAT_LLAMA3 : inst_family(jinja);
    if (t >= 0) return t;
    char head[128]; /* the start of its first line: enough to recognise a family by */
    size_t n = strcspn(jinja, "\n");
    snprintf(head, sizeof head, "%.*s", (int)(n < 120 ? n : 120), jinja);
    return chat_seterr(-ENOTSUP,
                       "chat template \"%s%s\": %s the built-in templates (%s); "
                       "pass one by name",
                       head, n > 120 || jinja[n] ? "..." : "",
                       chatml + llama3 + inst > 1 ? "spells the markers of more than one of"
                       : inst                     ? "an [INST] template unlike"
                                                  : "not one of",
                       chat_template_names());
}

/* Opens the GGUF file at path and copies its tokenizer.chat_template into *src (malloc()ed);
 * the file stays open in *g for the caller to read more and close. Errors set chat_err. */
static int open_template(const char *path, gguf_file **g, char **src)
{
    int err = gguf_open(path, g);
    if (err) return chat_seterr(err, "%s", gguf_errmsg());
    const char *s;
    size_t len;
    err = gguf_get_str(*g, "tokenizer.chat_template", &s, &len);
    if (err) {
        if (err == -ENOENT)
            chat_seterr(err, "%s: no tokenizer.chat_template", path);
        else
            chat_seterr(err, "%s: %s", path, gguf_errmsg());
        gguf_close(*g);
        return err;
    }
    *src = strndup(s, len);
    if (!*src) {
        gguf_close(*g);
        return chat_seterr(-ENOMEM, "out of memory");
    }
    return 0;
}

int chat_template_of_model(const char *path)
{
    gguf_file *g;
    char *copy;
    int err = open_template(path, &g, &copy);
    if (err) return err;
    gguf_close(g);
    err = chat_template_match(copy);
    free(copy);
    if (err < 0) chat_seterr(err, "%s: tokenizer.chat_template: %s", path, chat_err.msg);
    return err;
}

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void addn(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void add(sbuf *b, const char *s)
{
    addn(b, s, strlen(s));
}

/* Length of the whitespace character at s (JavaScript's String.trim set), 0 if none. */
static size_t ws_len(const unsigned char *s, size_t n)
{
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r'))) return 1;
    if (n >= 2 && s[0] == 0xC2 && s[1] == 0xA0) /* U+00A0 */
        return 2;
    if (n >= 3) {
        unsigned cp = (unsigned)(s[0] & 0x0F) << 12 | (unsigned)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        if ((s[0] & 0xF0) == 0xE0 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 &&
            (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
             cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF))
            return 3;
    }
    return 0;
}

/* Adds s with leading (lead) and trailing whitespace removed. */
static void add_trimmed(sbuf *b, const char *str, bool lead)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str), l;
    while (lead && n && (l = ws_len(s, n))) {
        s += l;
        n -= l;
    }
    for (bool again = true; again && n;) { /* trailing: try each width ending at n */
        again = false;
        for (size_t w = 1; w <= 3 && w <= n; w++)
            if (ws_len(s + n - w, w) == w) {
                n -= w;
                again = true;
                break;
            }
    }
    addn(b, (const char *)s, n);
}

/* Appends s[0] s[1] ... s[n-1] stripped of leading and trailing whitespace as a whole. */
static void add_stripped(sbuf *b, const char *const *s, int n)
{
    sbuf t = {0};
    for (int i = 0; i < n; i++) add(&t, s[i]);
    if (t.oom)
        b->oom = true;
    else if (t.p)
        add_trimmed(b, t.p, true);
    free(t.p);
}

/* Mistral's v7: system, user and assistant messages in any order. */
static int mistral_v7(const chat_msg *m, int n, sbuf *o)
{
    for (int i = 0; i < n; i++) {
        const char *r = m[i].role, *c = m[i].content;
        if (!strcmp(r, "system")) {
            add(o, "[SYSTEM_PROMPT] ");
            add(o, c);
            add(o, "[/SYSTEM_PROMPT]");
        } else if (!strcmp(r, "user")) {
            add(o, "[INST] ");
            add(o, c);
            add(o, "[/INST]");
        } else if (!strcmp(r, "assistant")) {
            add(o, " ");
            add(o, c);
            add(o, "</s>");
        } else {
            return chat_seterr(-EINVAL,
                               "message %d: the mistral-v7 template places system, "
                               "user and assistant messages only, not '%s'",
                               i, r);
        }
    }
    return 0;
}

/* The other [INST] templates: an optional system message, then user and assistant
 * alternating, ending on the user's. Where the system message goes: Llama 2 <<SYS>> and
 * Mistral's first template and v1 in the first user message, v3 in the last one. */
static int inst_like(int t, const chat_msg *m, int n, sbuf *o)
{
    const char *sys = NULL;
    int i = 0;
    if (strcmp(m[n - 1].role, "user"))
        return chat_seterr(-EINVAL, "the last message must be the user's");
    if (t == CHAT_MISTRAL_V7) return mistral_v7(m, n, o);
    if (n > 0 && !strcmp(m[0].role, "system")) {
        sys = m[0].content;
        i = 1;
    }
    if (i >= n) return chat_seterr(-EINVAL, "messages need at least one user message");
    for (int j = i, k = 0; j < n; j++, k++)
        if (strcmp(m[j].role, k % 2 == 0 ? "user" : "assistant"))
            return chat_seterr(-EINVAL,
                               "the %s template needs user and assistant messages to "
                               "alternate (after one optional system message)",
                               chat_template_name(t));
    const bool v3 = t == CHAT_MISTRAL_V3 || t == CHAT_MISTRAL_V3_TEKKEN;
    for (int k = 0; i < n; i++, k++) {
        const char *c = m[i].content;
        const bool with_sys = sys && (v3 ? i == n - 1 : k == 0);
        if (k % 2 == 0) {
            switch (t) {
            case CHAT_LLAMA2: /* strips the turn's whole text, <<SYS>> block included */
                add(o, k == 0 ? "[INST] " : "<s>[INST] ");
                add_stripped(o,
                             (const char *[]){with_sys ? "<<SYS>>\n" : "", with_sys ? sys : "",
                                              with_sys ? "\n<</SYS>>\n\n" : "", c},
                             4);
                add(o, " [/INST]");
                continue;
            case CHAT_MISTRAL_V1: add(o, " [INST] "); break;
            case CHAT_MISTRAL_V3_TEKKEN: add(o, "[INST]"); break;
            default: add(o, "[INST] ");
            }
            if (with_sys) {
                add(o, sys);
                add(o, "\n\n");
            }
            add(o, c);
            add(o, v3 ? "[/INST]" : " [/INST]");
        } else {
            if (t == CHAT_LLAMA2) {
                add(o, " ");
                add_trimmed(o, c, true);
                add(o, " </s>");
                continue;
            }
            if (t == CHAT_MISTRAL_V1 || t == CHAT_MISTRAL_V3) add(o, " ");
            if (t == CHAT_MISTRAL_V3)
                add_trimmed(o, c, true);
            else
                add(o, c);
            add(o, "</s>");
        }
    }
    return 0;
}

int chat_format(int t, const chat_msg *m, int n, char **text)
{
    sbuf o = {0};
    int err = 0;
    *text = NULL;
    if (n < 1 || !m) return chat_seterr(-EINVAL, "messages is empty");
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content)
            return chat_seterr(-EINVAL, "message %d: role and content are required", i);
    add(&o, "");
    switch (t) {
    case CHAT_PLAIN:
        for (int i = 0; i < n; i++) {
            if (i) add(&o, "\n");
            add(&o, m[i].content);
        }
        break;
    case CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            add(&o, "<|im_start|>");
            add(&o, m[i].role);
            add(&o, "\n");
            add(&o, m[i].content);
            add(&o, "<|im_end|>\n");
        }
        add(&o, "<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            add(&o, "<|start_header_id|>");
            add(&o, m[i].role);
            add(&o, "<|end_header_id|>\n\n");
            add_trimmed(&o, m[i].content, true);
            add(&o, "<|eot_id|>");
        }
        add(&o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_LLAMA2:
    case CHAT_MISTRAL:
    case CHAT_MISTRAL_V1:
    case CHAT_MISTRAL_V3:
    case CHAT_MISTRAL_V3_TEKKEN:
    case CHAT_MISTRAL_V7: err = inst_like(t, m, n, &o); break;
    default: err = chat_seterr(-EINVAL, "chat template %d: unknown", t);
    }
    if (!err && o.oom) err = chat_seterr(-ENOMEM, "out of memory");
    if (err) {
        free(o.p);
        return err;
    }
    *text = o.p;
    return 0;
}

/* ---- the model file's own template ------------------------------------------------------- */

struct chat_jinja {
    jinja_template *t;
    char *bos, *eos;
};

int chat_jinja_new(const char *source, const char *bos, const char *eos, chat_jinja **out)
{
    *out = NULL;
    if (!source) return chat_seterr(-EINVAL, "chat template: NULL");
    chat_jinja *c = calloc(1, sizeof *c);
    if (!c) return chat_seterr(-ENOMEM, "out of memory");
    c->bos = strdup(bos ? bos : "");
    c->eos = strdup(eos ? eos : "");
    int err = c->bos && c->eos ? jinja_parse(source, strlen(source), &c->t) : -ENOMEM;
    if (err) {
        chat_seterr(err, "%s", err == -ENOMEM ? "out of memory" : jinja_errmsg());
        chat_jinja_free(c);
        return err;
    }
    *out = c;
    return 0;
}

/* The text of the token the id key names ("" when the file names none). */
static char *token_text(gguf_file *g, const char *key)
{
    uint64_t id, n;
    uint32_t et;
    const void *p;
    const char *s = "";
    size_t len = 0;
    if (!gguf_get_u64(g, key, &id) && !gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &p) &&
        et == GGUF_V_STRING && id < n)
        for (uint64_t i = 0; i <= id; i++) gguf_str_next(&p, &s, &len);
    return strndup(s, len);
}

int chat_jinja_load(const char *path, chat_jinja **out)
{
    *out = NULL;
    gguf_file *g;
    char *src;
    int err = open_template(path, &g, &src);
    if (err) return err;
    char *bos = token_text(g, "tokenizer.ggml.bos_token_id"),
         *eos = token_text(g, "tokenizer.ggml.eos_token_id");
    gguf_close(g);
    err = bos && eos ? chat_jinja_new(src, bos, eos, out) : -ENOMEM;
    if (err)
        chat_seterr(err, "%s: tokenizer.chat_template does not parse: %s", path,
                    err == -ENOMEM ? "out of memory" : chat_err.msg);
    free(src);
    free(bos);
    free(eos);
    return err;
}

int chat_jinja_render(const chat_jinja *c, const char *vars_json, unsigned flags, char **text)
{
    *text = NULL;
    if (!c) return chat_seterr(-EINVAL, "chat template: NULL");
    json_error_t je;
    json_t *v = vars_json ? json_loads(vars_json, 0, &je) : json_object();
    if (!json_is_object(v)) {
        json_decref(v);
        return chat_seterr(-EINVAL, "the chat template's variables: %s",
                           vars_json && !v ? je.text : "not a JSON object");
    }
    if (!json_object_get(v, "bos_token")) json_object_set_new(v, "bos_token", json_string(c->bos));
    if (!json_object_get(v, "eos_token")) json_object_set_new(v, "eos_token", json_string(c->eos));
    if (!json_object_get(v, "add_generation_prompt"))
        json_object_set_new(v, "add_generation_prompt", json_true());
    size_t len;
    char *out;
    int err = jinja_render(c->t, v, NULL, &out, &len);
    json_decref(v);
    if (err) return chat_seterr(err, "chat template: %s", jinja_errmsg());
    size_t nb = strlen(c->bos);
    if ((flags & CHAT_JINJA_STRIP_BOS) && nb && len >= nb && !memcmp(out, c->bos, nb))
        memmove(out, out + nb, (len -= nb) + 1);
    size_t ne = strlen(c->eos);
    if ((flags & CHAT_JINJA_STRIP_EOS) && ne && len >= ne && !memcmp(out + len - ne, c->eos, ne))
        out[len - ne] = 0;
    *text = out;
    return 0;
}

void chat_jinja_free(chat_jinja *c)
{
    if (!c) return;
    jinja_free(c->t);
    free(c->bos);
    free(c->eos);
    free(c);
}
