/* SPDX-License-Identifier: MIT */
/*
 * model/gguf_vocab.c — a Hugging Face tokenizer.json (+ tokenizer_config.json) as the
 * GGUF vocabulary llama.cpp's converter would write (ringlm-mkmodel --vocab):
 *
 *   - byte-level BPE (a ByteLevel pre-tokenizer or decoder): tokenizer.ggml.model "gpt2",
 *     the merges, and tokenizer.ggml.pre named from the Split expression (Llama 3's digits
 *     in threes: "llama-bpe"; Qwen2's single digits: "qwen2"; anything else is refused);
 *   - BPE with byte_fallback (Llama 2, Mistral): "llama", i.e. SentencePiece, the "▁" pieces
 *     as they are, each merge's result scored by its rank (earlier merges score higher);
 *   - added tokens: special ones CONTROL, the others USER_DEFINED; ids the file leaves
 *     unused up to the model's vocabulary become "[PAD<id>]" (UNUSED), as llama.cpp pads;
 *   - the special tokens and add_bos/add_eos/add_sep as the converter's SpecialVocab
 *     finds them (tokenizer.json's post-processor, tokenizer_config.json, config.json;
 *     special_vocab below), EOT else from the first of <|eot_id|>, <|im_end|>, <|end|>
 *     present, and the config's chat_template.
 */
#include "model/gguf_write.h"
#include "model/spm_proto.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

void gw_vocab_free(gw_vocab *v)
{
    if (!v) return;
    for (size_t i = 0; v->tokens && i < v->n; i++) free(v->tokens[i]);
    for (size_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->lens);
    free(v->scores);
    free(v->types);
    free(v->merges);
    free(v->chat_template);
    free(v);
}

static int32_t find_token(const gw_vocab *v, const char *s)
{
    if (!s) return -1;
    for (size_t i = 0; i < v->n; i++)
        if (v->tokens[i] && strcmp(v->tokens[i], s) == 0) return (int32_t)i;
    return -1;
}

/* EOT, where the converter's SpecialVocab named none: the first of the end-of-turn tokens the
 * vocabulary holds (llama.cpp finds these by their text when it loads a file; ringlm reads the
 * key) */
static void find_eot(gw_vocab *v)
{
    static const char *const eots[] = {"<|eot_id|>", "<|im_end|>", "<|end|>"};
    for (size_t i = 0; i < sizeof eots / sizeof eots[0] && v->eot < 0; i++)
        v->eot = find_token(v, eots[i]);
}

/* ---- llama.cpp's SpecialVocab (gguf-py/gguf/vocab.py) ------------------------------------ */

/* The special token types in SpecialVocab's order; eot and eom join when a
 * TemplateProcessing's trailing token displaces the configured EOS. */
enum { SV_BOS, SV_EOS, SV_UNK, SV_SEP, SV_PAD, SV_CLS, SV_MASK, SV_EOT, SV_EOM, SV_N };
static const char *const sv_names[SV_N] = {"bos", "eos",  "unk", "sep", "pad",
                                           "cls", "mask", "eot", "eom"};

/* Python's truth value of a JSON value (absent: None) */
static bool py_truthy(const json_t *j)
{
    switch (j ? json_typeof(j) : JSON_NULL) {
    case JSON_STRING: return json_string_length(j) > 0;
    case JSON_OBJECT: return json_object_size(j) > 0;
    case JSON_ARRAY: return json_array_size(j) > 0;
    case JSON_TRUE: return true;
    case JSON_INTEGER:
    case JSON_REAL: return json_number_value(j) != 0;
    default: return false;
    }
}

/* a == b for a truthy a (every comparison SpecialVocab makes has one on the left) */
static bool py_eq(const json_t *a, const json_t *b)
{
    return a && b && json_equal((json_t *)a, (json_t *)b);
}

/* A SpecialToken's id in a TemplateProcessing piece: piece.get('SpecialToken', {}).get('id') */
static json_t *tp_special(json_t *piece)
{
    return json_object_get(json_object_get(piece, "SpecialToken"), "id");
}

/* Holds a new reference in *slot (the old one dropped). */
static void sv_hold(json_t **slot, json_t *j)
{
    json_incref(j);
    json_decref(*slot);
    *slot = j;
}

/* The state SpecialVocab keeps while it reads tokenizer.json's post-processor. */
typedef struct sv_state {
    json_t *cfg; /* tokenizer_config.json, a copy the reading updates; NULL: none */
    json_t *bos, *cls, *eos, *sep;
    int n_types;   /* SV_MASK + 1, + eot, + eom */
    int8_t add[3]; /* bos, eos, sep: -1 unset */
} sv_state;

static void sv_cfg_set(sv_state *st, const char *key, json_t *val)
{
    if (val) json_object_set(st->cfg, key, val);
}

/* `special_x = tokenizer_config[key] = val`: the local and the config both take val */
static void sv_take(sv_state *st, json_t **slot, const char *key, json_t *val)
{
    sv_hold(slot, val);
    sv_cfg_set(st, key, val);
}

/* One TemplateProcessing: which special tokens it puts before and after a sequence (BOS,
 * EOS), and between the two of a pair (SEP) — the converter's crude parse, step for step. */
static void sv_template(sv_state *st, json_t *proc)
{
    const bool have_cfg = py_truthy(st->cfg);
    json_t *single = json_object_get(proc, "single"), *pair = json_object_get(proc, "pair");
    json_t *first = NULL, *last = NULL;
    if (json_array_size(single) > 1) {
        json_t *f = tp_special(json_array_get(single, 0));
        if (py_truthy(f)) {
            first = f;
            if (!have_cfg) {
                sv_hold(&st->bos, f);
            } else if (!py_eq(f, st->bos) && !py_eq(f, st->cls)) {
                if (!py_truthy(st->bos)) sv_take(st, &st->bos, "bos_token", f);
                if (!py_truthy(st->cls)) sv_take(st, &st->cls, "cls_token", f);
            }
            st->add[0] = py_eq(f, st->bos) || py_eq(f, st->cls);
        }
        json_t *l = tp_special(json_array_get(single, json_array_size(single) - 1));
        if (py_truthy(l)) {
            last = l;
            if (!have_cfg) {
                sv_hold(&st->eos, l);
            } else if (!py_eq(l, st->eos)) {
                if (st->n_types < SV_EOM + 1) {
                    sv_cfg_set(st, st->n_types == SV_EOT ? "eot_token" : "eom_token", st->eos);
                    st->n_types++;
                }
                sv_take(st, &st->eos, "eos_token", l);
            }
            st->add[1] = py_eq(l, st->eos);
        }
    }
    size_t lo = 0, hi = json_array_size(pair);
    if (!hi) return;
    if (first && py_eq(tp_special(json_array_get(pair, 0)), first)) lo = 1;
    if (last && py_eq(tp_special(json_array_get(pair, hi - 1)), last)) hi--;
    if (lo >= hi) return;
    const char *a = json_string_value(
        json_object_get(json_object_get(json_array_get(pair, lo), "Sequence"), "id"));
    const char *b = json_string_value(
        json_object_get(json_object_get(json_array_get(pair, hi - 1), "Sequence"), "id"));
    /* A [sep] [eos] B: what lies between the two sequences */
    if (!a || !b || strcmp(a, "A") || strcmp(b, "B") || hi - lo <= 2) return;
    lo++, hi--;
    bool add_sep = false;
    json_t *e = tp_special(json_array_get(pair, lo));
    if (py_truthy(e) && (py_eq(e, st->sep) || py_eq(e, st->eos)) && !last) add_sep = true;
    if (hi - lo == 2) {
        e = tp_special(json_array_get(pair, lo + 1));
        if (py_truthy(e) && (py_eq(e, st->sep) || py_eq(e, st->eos))) add_sep = true;
    }
    st->add[2] = add_sep;
    if (add_sep && !py_truthy(st->sep) && have_cfg) sv_cfg_set(st, "sep_token", st->eos);
}

/* A config id as SpecialVocab's _set_special_token takes it: an integer inside the
 * vocabulary (or skipped), the first one found for its type kept. */
static int sv_set(int32_t *slot, json_t *id, size_t n, const char *src, const char *typ)
{
    const double x = json_number_value(id);
    if (!json_is_integer(id) && !(json_is_real(id) && x == (double)(long long)x)) return 0;
    if (x < 0) return gw_seterr(-EINVAL, "%s: %s token id %.0f: negative", src, typ, x);
    if (*slot < 0 && x < (double)n) *slot = (int32_t)x;
    return 0;
}

/* The special token ids and the add_bos/add_eos/add_sep flags the converter's SpecialVocab
 * reads from a checkpoint's tokenizer.json (tok), tokenizer_config.json (cfg) and
 * config.json (config), each NULL where absent, into v (ids -1 and flags -1 where it finds
 * none). Only ids inside v's n tokens are taken (the converter's GPT-2 reader writes an id
 * past them, which no loader accepts). */
static int special_vocab(gw_vocab *v, json_t *tok, json_t *cfg, json_t *config, const char *cfg_src,
                         const char *config_src)
{
    int32_t ids[SV_N];
    for (int i = 0; i < SV_N; i++) ids[i] = -1;
    sv_state st = {.cfg = json_is_object(cfg) ? json_deep_copy(cfg) : NULL,
                   .n_types = SV_MASK + 1,
                   .add = {-1, -1, -1}};
    if (cfg && !st.cfg) return gw_seterr(-ENOMEM, "out of memory");
    json_t *added = py_truthy(tok) ? json_object_get(tok, "added_tokens") : NULL;
    if (py_truthy(tok)) {
        sv_hold(&st.bos, json_object_get(st.cfg, "bos_token"));
        sv_hold(&st.cls, json_object_get(st.cfg, "cls_token"));
        sv_hold(&st.eos, json_object_get(st.cfg, "eos_token"));
        sv_hold(&st.sep, json_object_get(st.cfg, "sep_token"));
        const bool have_cfg = py_truthy(st.cfg);
        if (!py_truthy(st.bos) && py_truthy(st.cls) && have_cfg)
            sv_take(&st, &st.bos, "bos_token", st.cls);
        if (!py_truthy(st.eos) && py_truthy(st.sep) && have_cfg)
            sv_take(&st, &st.eos, "eos_token", st.sep);
        json_t *pp = json_object_get(tok, "post_processor");
        if (py_truthy(pp) && json_is_object(pp)) {
            json_t *procs = json_object_get(pp, "processors");
            const size_t np = procs ? json_array_size(procs) : 1;
            for (size_t i = 0; i < np; i++) {
                json_t *proc = procs ? json_array_get(procs, i) : pp;
                const char *type = json_string_value(json_object_get(proc, "type"));
                if (type && strcmp(type, "RobertaProcessing") == 0) {
                    st.add[0] = st.add[1] = st.add[2] = 1;
                    if (!py_truthy(st.cls) && have_cfg) {
                        json_t *c = json_object_get(proc, "cls");
                        sv_hold(&st.cls, c ? json_array_get(c, 0) : st.bos);
                        sv_cfg_set(&st, "cls_token", st.cls ? st.cls : json_null());
                    }
                    if (!py_truthy(st.sep) && have_cfg) {
                        json_t *sp = json_object_get(proc, "sep");
                        sv_hold(&st.sep, sp ? json_array_get(sp, 0) : st.eos);
                        sv_cfg_set(&st, "sep_token", st.sep ? st.sep : json_null());
                    }
                } else if (type && strcmp(type, "TemplateProcessing") == 0) {
                    sv_template(&st, proc);
                }
            }
        }
    }
    int err = 0;
    if (py_truthy(st.cfg)) {
        for (int t = 0; t < st.n_types && !err; t++) {
            char key[32];
            snprintf(key, sizeof key, "add_%s_token", sv_names[t]);
            json_t *ae = json_object_get(st.cfg, key);
            if (json_is_boolean(ae) && (t == SV_BOS || t == SV_EOS || t == SV_SEP))
                st.add[t == SV_BOS ? 0 : t == SV_EOS ? 1 : 2] = json_is_true(ae);
            snprintf(key, sizeof key, "%s_token", sv_names[t]);
            json_t *entry = json_object_get(st.cfg, key);
            if (json_is_object(entry)) entry = json_object_get(entry, "content");
            const char *content = json_string_value(entry);
            if (!content) continue;
            size_t i;
            json_t *at;
            json_array_foreach(added, i, at)
            {
                const char *c = json_string_value(json_object_get(at, "content"));
                if (c && strcmp(c, content) == 0) {
                    err = sv_set(&ids[t], json_object_get(at, "id"), v->n, cfg_src, sv_names[t]);
                    break;
                }
            }
        }
    }
    for (int t = 0; t < st.n_types && !err && config; t++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token_id", sv_names[t]);
        json_t *id = json_object_get(config, key);
        if (!id) id = json_object_get(json_object_get(config, "text_config"), key);
        err = sv_set(&ids[t], id, v->n, config_src, sv_names[t]);
    }
    json_decref(st.cfg);
    json_decref(st.bos);
    json_decref(st.cls);
    json_decref(st.eos);
    json_decref(st.sep);
    if (err) return err;
    v->bos = ids[SV_BOS];
    v->eos = ids[SV_EOS];
    v->unk = ids[SV_UNK];
    v->sep = ids[SV_SEP];
    v->pad = ids[SV_PAD];
    v->cls = ids[SV_CLS];
    v->mask = ids[SV_MASK];
    v->eot = ids[SV_EOT];
    v->eom = ids[SV_EOM];
    v->add_bos = st.add[0];
    v->add_eos = st.add[1];
    v->add_sep = st.add[2];
    return 0;
}

int gw_vocab_from_hf(const char *tok_path, const char *cfg_path, int vocab_size, gw_vocab **out)
{
    return gw_vocab_from_hf_config(tok_path, cfg_path, NULL, vocab_size, out);
}

int gw_vocab_from_hf_config(const char *tok_path, const char *cfg_path, const char *config_path,
                            int vocab_size, gw_vocab **out)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(tok_path, 0, &je), *cfg = NULL, *config = NULL;
    if (!root) return gw_seterr(-EINVAL, "%s:%d: %s", tok_path, je.line, je.text);
    /* configs hold model_max_length = 1e30: integers as reals */
    if (cfg_path && !(cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je))) {
        json_decref(root);
        return gw_seterr(-EINVAL, "%s:%d: %s", cfg_path, je.line, je.text);
    }
    if (config_path && !(config = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &je))) {
        json_decref(root);
        json_decref(cfg);
        return gw_seterr(-EINVAL, "%s:%d: %s", config_path, je.line, je.text);
    }
    int err = 0;
    gw_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab) || !json_is_array(merges)) {
        err = gw_seterr(-EINVAL,
                        "%s: model.type \"%s\": only BPE models (model.vocab, "
                        "model.merges) are supported",
                        tok_path, mtype ? mtype : "?");
        goto out;
    }
    json_t *parts = json_pack("[OO]", json_object_get(root, "pre_tokenizer") ?: json_null(),
                              json_object_get(root, "decoder") ?: json_null());
    char *dump = parts ? json_dumps(parts, JSON_COMPACT) : NULL;
    json_decref(parts);
    if (!dump) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    bool bytelevel = strstr(dump, "\"ByteLevel\"") != NULL;
    bool fallback = json_is_true(json_object_get(model, "byte_fallback"));
    const char *pre = NULL;
    if (bytelevel) {
        /* the Split expression tells Llama 3's digits-in-threes from Qwen2's single digits */
        if (strstr(dump, "\\\\p{N}{1,3}"))
            pre = "llama-bpe";
        else if (strstr(dump, "|\\\\p{N}|"))
            pre = "qwen2";
    }
    free(dump);
    if (bytelevel && !pre) {
        err = gw_seterr(-EINVAL,
                        "%s: a byte-level BPE whose pre-tokenizer expression is "
                        "neither Llama 3's nor Qwen2's: not supported",
                        tok_path);
        goto out;
    }
    if (!bytelevel && !fallback) {
        err = gw_seterr(-EINVAL,
                        "%s: BPE that is neither byte-level nor SentencePiece-like "
                        "(byte_fallback): not supported",
                        tok_path);
        goto out;
    }
    v->model = bytelevel ? "gpt2" : "llama";
    v->pre = pre;
    /* ids: the vocabulary's and the added tokens' */
    size_t n = 0;
    const char *k;
    json_t *val;
    json_object_foreach(vocab, k, val)
    {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= (1 << 22)) {
            err = gw_seterr(-EINVAL, "%s: model.vocab[\"%s\"]: id must be 0..2^22", tok_path, k);
            goto out;
        }
        if ((size_t)id + 1 > n) n = (size_t)id + 1;
    }
    json_t *added = json_object_get(root, "added_tokens");
    size_t ai;
    json_array_foreach(added, ai, val)
    {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        if (id < 0 || id >= (1 << 22) || !json_string_value(json_object_get(val, "content"))) {
            err = gw_seterr(-EINVAL, "%s: added_tokens[%zu]: needs id 0..2^22 and content",
                            tok_path, ai);
            goto out;
        }
        if ((size_t)id + 1 > n) n = (size_t)id + 1;
    }
    if (n > (size_t)vocab_size) {
        err = gw_seterr(-EINVAL,
                        "%s: %zu tokens, more than the model's vocabulary of %d "
                        "(pick a preset whose vocabulary fits)",
                        tok_path, n, vocab_size);
        goto out;
    }
    v->n = (size_t)vocab_size;
    v->n_listed = json_object_size(vocab) + json_array_size(added);
    v->tokens = calloc(v->n, sizeof *v->tokens);
    v->lens = calloc(v->n, sizeof *v->lens);
    v->types = calloc(v->n, sizeof *v->types);
    v->scores = calloc(v->n, sizeof *v->scores);
    v->merges = calloc(json_array_size(merges) + 1, sizeof *v->merges);
    if (!v->tokens || !v->lens || !v->types || !v->scores || !v->merges) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    json_object_foreach(vocab, k, val)
    {
        size_t id = (size_t)json_integer_value(val);
        free(v->tokens[id]);
        v->tokens[id] = strdup(k);
        v->types[id] = TT_NORMAL;
        if (fallback && strlen(k) == 6 && strncmp(k, "<0x", 3) == 0 && k[5] == '>')
            v->types[id] = TT_BYTE;
    }
    json_array_foreach(added, ai, val)
    {
        size_t id = (size_t)json_integer_value(json_object_get(val, "id"));
        free(v->tokens[id]);
        v->tokens[id] = strdup(json_string_value(json_object_get(val, "content")));
        v->types[id] = json_is_true(json_object_get(val, "special")) ? TT_CONTROL : TT_USER;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    for (size_t i = 0; i < v->n; i++) {
        if (!v->tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%zu]", i);
            v->tokens[i] = strdup(pad);
            v->types[i] = TT_UNUSED;
        }
        if (!v->tokens[i]) {
            err = gw_seterr(-ENOMEM, "out of memory");
            goto out;
        }
        v->lens[i] = strlen(v->tokens[i]);
        v->scores[i] = fallback ? -1e9f : 0.0f;
    }
    /* merges: "LEFT RIGHT" strings or [LEFT, RIGHT] pairs */
    json_array_foreach(merges, ai, val)
    {
        const char *l = NULL, *r = NULL, *s = json_string_value(val);
        char *m = NULL;
        if (s) {
            m = strdup(s);
        } else if (json_array_size(val) == 2) {
            l = json_string_value(json_array_get(val, 0));
            r = json_string_value(json_array_get(val, 1));
            if (l && r && asprintf(&m, "%s %s", l, r) < 0) m = NULL;
        }
        if (!m) {
            err = gw_seterr(s || (l && r) ? -ENOMEM : -EINVAL,
                            "%s: model.merges[%zu]: expected "
                            "\"LEFT RIGHT\" or [LEFT, RIGHT]",
                            tok_path, ai);
            goto out;
        }
        v->merges[v->n_merges++] = m;
    }
    if (fallback) {
        /* SentencePiece merges the pair whose result scores highest: score each merge's
         * result by its rank (first merges highest); bytes and specials keep 0 */
        for (size_t i = v->n_merges; i-- > 0;) {
            char *sp = strchr(v->merges[i] + 1, ' ');
            if (!sp) continue;
            char *joined = malloc(strlen(v->merges[i]));
            if (!joined) {
                err = gw_seterr(-ENOMEM, "out of memory");
                goto out;
            }
            size_t ll = (size_t)(sp - v->merges[i]);
            memcpy(joined, v->merges[i], ll);
            strcpy(joined + ll, sp + 1);
            json_t *id = json_object_get(vocab, joined);
            if (json_is_integer(id)) v->scores[json_integer_value(id)] = -(float)i;
            free(joined);
        }
        for (size_t i = 0; i < v->n; i++)
            if (v->types[i] != TT_NORMAL) v->scores[i] = 0.0f;
        v->unk = find_token(v, unk);
    } else {
        v->unk = -1;
    }
    const int32_t model_unk = v->unk;
    if ((err = special_vocab(v, root, cfg, config, cfg_path, config_path))) goto out;
    if (v->unk < 0) v->unk = model_unk; /* model.unk_token where the configs name none */
    find_eot(v);
    const char *tpl = json_string_value(json_object_get(cfg, "chat_template"));
    if (tpl && !(v->chat_template = strdup(tpl))) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
out:
    json_decref(root);
    json_decref(cfg);
    json_decref(config);
    if (err) {
        gw_vocab_free(v);
        return err;
    }
    *out = v;
    return 0;
}

int gw_vocab_trim(gw_vocab *v, size_t n, const char *src)
{
    for (size_t i = n; i < v->n; i++)
        if (v->types[i] != TT_UNUSED)
            return gw_seterr(-EINVAL,
                             "%s: token %zu \"%.64s\" lies past the first %zu, which the model "
                             "keeps",
                             src, i, v->tokens[i], n);
    const int32_t ids[5] = {v->bos, v->eos, v->eot, v->unk, v->pad};
    for (int k = 0; k < 5; k++)
        if (ids[k] >= 0 && (size_t)ids[k] >= n)
            return gw_seterr(-EINVAL, "%s: special token %d lies past the first %zu", src, ids[k],
                             n);
    for (size_t i = n; i < v->n; i++) {
        free(v->tokens[i]);
        v->tokens[i] = NULL;
    }
    v->n = n;
    return 0;
}

/* ---- a SentencePiece tokenizer.model ------------------------------------------------------ */

/* The converter's does_token_look_special: added tokens some checkpoints forget to mark */
static bool looks_special(const char *s)
{
    const size_t n = strlen(s);
#define ENDS(suffix) (n >= strlen(suffix) && strcmp(s + n - strlen(suffix), suffix) == 0)
    return !strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") ||
           !strcmp(s, "[@BOS@]") || (!strncmp(s, "<|", 2) && ENDS("|>") && n >= 4) ||
           (!strncmp(s, "<\xef\xbd\x9c", 4) && ENDS("\xef\xbd\x9c>") && n >= 8) ||
           (!strncmp(s, "<unused", 7) && ENDS(">"));
#undef ENDS
}

static int set_token(gw_vocab *v, size_t id, const char *text, float score, int32_t type)
{
    char *t = strdup(text);
    if (!t) return gw_seterr(-ENOMEM, "out of memory");
    free(v->tokens[id]);
    v->tokens[id] = t;
    v->lens[id] = strlen(t);
    v->scores[id] = score;
    v->types[id] = type;
    return 0;
}

/* "▁" (U+2581) written as " ": the converter's pre-normalized user-defined spaces */
static void unescape_spaces(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        if (!strncmp(r, "\xe2\x96\x81", 3)) {
            *w++ = ' ';
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* A token id: configs are read with integers as reals (model_max_length can exceed 2^63) */
static long json_id(json_t *v)
{
    double x = json_number_value(v);
    return json_is_number(v) && x >= 0 && x < (1 << 30) && x == (double)(long)x ? (long)x : -1;
}

static json_t *load_json_opt(const char *path, int *err)
{
    json_error_t je;
    *err = 0;
    if (access(path, F_OK) != 0) return NULL;
    json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!j) *err = gw_seterr(-EINVAL, "%s:%d: %s", path, je.line, je.text);
    return j;
}

int gw_vocab_from_spm(const char *dir, int vocab_size, gw_vocab **out)
{
    *out = NULL;
    char path[4096], cfg_path[4096], added_path[4096], config_path[4096], tokjson_path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    snprintf(tokjson_path, sizeof tokjson_path, "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    snprintf(added_path, sizeof added_path, "%s/added_tokens.json", dir);
    snprintf(config_path, sizeof config_path, "%s/config.json", dir);
    spm_model *m = NULL;
    json_t *cfg = NULL, *added = NULL, *config = NULL, *tokjson = NULL;
    gw_vocab *v = NULL;
    int err = spm_load(path, &m);
    if (err) return gw_seterr(err, "%s", spm_errmsg());
    static const char *const mtypes[] = {"?", "UNIGRAM", "BPE", "WORD", "CHAR"};
    if (m->model_type != SPM_BPE) {
        err =
            gw_seterr(-EINVAL,
                      "%s: trainer_spec.model_type %s: only BPE SentencePiece models are "
                      "imported (Llama 2, Mistral, Gemma; a unigram model merged by score "
                      "tokenizes differently from SentencePiece)",
                      path, m->model_type >= 1 && m->model_type <= 4 ? mtypes[m->model_type] : "?");
        goto out;
    }
    if (m->treat_whitespace_as_suffix || m->remove_extra_whitespaces || !m->escape_whitespaces ||
        (m->normalizer[0] && strcmp(m->normalizer, "identity")) || m->has_charsmap) {
        err = gw_seterr(-EINVAL,
                        "%s: normalizer \"%s\"%s%s%s%s: not supported (an identity normalizer "
                        "that keeps whitespace and escapes it as a prefix, as Llama 2, Mistral "
                        "and Gemma ship)",
                        path, m->normalizer, m->has_charsmap ? ", a normalization map" : "",
                        m->remove_extra_whitespaces ? ", remove_extra_whitespaces" : "",
                        m->escape_whitespaces ? "" : ", whitespace not escaped",
                        m->treat_whitespace_as_suffix ? ", whitespace as a suffix" : "");
        goto out;
    }
    if ((cfg = load_json_opt(cfg_path, &err), err) ||
        (added = load_json_opt(added_path, &err), err) ||
        (config = load_json_opt(config_path, &err), err))
        goto out;
    if (!(v = calloc(1, sizeof *v))) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    v->model = "llama";
    v->pre = "default";
    v->n = (size_t)vocab_size;
    v->tokens = calloc(v->n, sizeof *v->tokens);
    v->lens = calloc(v->n, sizeof *v->lens);
    v->types = calloc(v->n, sizeof *v->types);
    v->scores = calloc(v->n, sizeof *v->scores);
    if (!v->tokens || !v->lens || !v->types || !v->scores) {
        err = gw_seterr(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < v->n && !err; i++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%zu]", i);
        if (i < m->n_pieces) {
            /* the converter asks IsUnknown, IsControl, IsUnused, IsByte: USER_DEFINED pieces
             * are NORMAL tokens in its file */
            int32_t t = m->types[i] == SPM_USER_DEFINED ? SPM_NORMAL : m->types[i];
            err = set_token(v, i, m->pieces[i], m->scores[i], t);
        } else {
            err = set_token(v, i, pad, -10000.0f, SPM_UNUSED);
        }
    }
    if (err) goto out;
    const char *k;
    json_t *val;
    json_object_foreach(added, k, val)
    {
        if (json_id(val) < 0) {
            err = gw_seterr(-EINVAL, "%s: \"%s\": a token id expected", added_path, k);
            goto out;
        }
        size_t id = (size_t)json_id(val);
        if (id < v->n && (err = set_token(v, id, k, -1000.0f, SPM_USER_DEFINED))) goto out;
    }
    json_object_foreach(json_object_get(cfg, "added_tokens_decoder"), k, val)
    {
        char *end;
        long id = strtol(k, &end, 10);
        const char *content = json_string_value(json_object_get(val, "content"));
        if (*k == '\0' || *end || id < 0 || !content) {
            err = gw_seterr(-EINVAL,
                            "%s: added_tokens_decoder[\"%s\"]: a token id and its content "
                            "expected",
                            cfg_path, k);
            goto out;
        }
        if ((size_t)id >= v->n) continue; /* the converter skips it, as here */
        const bool control =
            json_is_true(json_object_get(val, "special")) || looks_special(content);
        if ((err = set_token(v, (size_t)id, content, -1000.0f,
                             control ? SPM_CONTROL : SPM_USER_DEFINED)))
            goto out;
        if (!control) {
            unescape_spaces(v->tokens[id]);
            v->lens[id] = strlen(v->tokens[id]);
        }
    }
    /* special ids and add_* as the converter's SpecialVocab finds them (tokenizer.json's
     * post-processor and added tokens where that file is there too); else the model's own */
    if ((tokjson = load_json_opt(tokjson_path, &err), err)) goto out;
    if ((err = special_vocab(v, tokjson, cfg, config, cfg_path, config_path))) goto out;
    const int32_t own[4] = {m->bos_id, m->eos_id, m->unk_id, m->pad_id};
    int32_t *ids[4] = {&v->bos, &v->eos, &v->unk, &v->pad};
    for (int i = 0; i < 4; i++)
        if (*ids[i] < 0 && own[i] >= 0 && (size_t)own[i] < v->n) *ids[i] = own[i];
    find_eot(v);
    /* a llama tokenizer_config's add_prefix_space overrides the normalizer, as the
     * converter writes it */
    json_t *aps = json_object_get(cfg, "add_prefix_space");
    v->no_space_prefix = json_is_boolean(aps) ? json_is_false(aps) : !m->add_dummy_prefix;
    const char *tpl = json_string_value(json_object_get(cfg, "chat_template"));
    if (tpl && !(v->chat_template = strdup(tpl))) err = gw_seterr(-ENOMEM, "out of memory");
out:
    spm_free(m);
    json_decref(cfg);
    json_decref(added);
    json_decref(config);
    json_decref(tokjson);
    if (err) {
        gw_vocab_free(v);
        return err;
    }
    *out = v;
    return 0;
}
