/* SPDX-License-Identifier: MIT */
/*
 * The gateway's prompt ids against llama.cpp's server on the same vocabulary: BOS and EOS
 * where the file's tokenizer.ggml.add_bos_token and add_eos_token say, and a chat template's
 * own BOS and EOS texts left out only where the tokenizer adds the ids (llama.cpp's
 * common_chat_template strips them so), so a chat starts with one BOS either way. A real
 * ringlmd (stories260K) and gateway; the ids the daemon is sent are seen in
 * usage.prompt_tokens (completions, chat), usage.input_tokens (responses) and /tokenize;
 * llama.cpp's are node-llama-cpp's (tests/node/tokenize.mjs: special tokens parsed, BOS and
 * EOS added as the file asks) on stories260K's GGUF model file with the same vocabulary and
 * flags.
 */
#include "tests/gateway_helpers.h"
#include "tests/gguf_test_util.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "libclient/ringlm.h"

TestSuite(gateway_bos, .fini = gwh_stop_all, .timeout = 240);

/* A template that renders its own BOS and EOS texts around the messages. */
static const char *const tpl = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content "
                               "}}{% endfor %}{{ eos_token }}";
static const char *const prompt = "Once upon a time";

/* stories260K exported to a GGUF model file with tok512's vocabulary (ringlm-mkmodel: the
 * pieces and token types gwh_stories_gguf writes; llama.cpp loads a vocabulary only from a
 * whole model file), its add_bos_token and add_eos_token (which the exporter writes, true and
 * false) set to add_bos and add_eos in place. */
static char *stories_model(const char *name, bool add_bos, bool add_eos)
{
    char *path = th_path(gwh_dir(), name), *mk = th_path(th_bin_dir(), "ringlm-mkmodel"),
         *model = th_shared_file("models/stories260K.bin"),
         *tok = th_shared_file("models/tok512.bin"), cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' --model '%s' --tokenizer '%s' --format gguf --out '%s' >/dev/null 2>&1", mk,
             model, tok, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    static char g[1 << 16]; /* the metadata: it comes before the tensors */
    size_t len = fread(g, 1, sizeof g, f);
    cr_assert_eq(len, sizeof g, "%s: %zu bytes", path, len);
    static const char *const keys[] = {"tokenizer.ggml.add_bos_token",
                                       "tokenizer.ggml.add_eos_token"};
    for (int k = 0; k < 2; k++) {
        char *at = memmem(g, len, keys[k], strlen(keys[k]));
        cr_assert_not_null(at, "%s: no %s", path, keys[k]);
        at += strlen(keys[k]);
        uint32_t type;
        memcpy(&type, at, 4);
        cr_assert_eq(type, 7, "%s: %s is not a bool", path, keys[k]); /* GGUF_TYPE_BOOL */
        at[4] = (char)(k ? add_eos : add_bos);
    }
    rewind(f);
    cr_assert(fwrite(g, 1, len, f) == len && fclose(f) == 0, "writing %s", path);
    free(mk);
    free(model);
    free(tok);
    return path;
}

/* llama.cpp's ids of the files (node-llama-cpp): out[i] = {llama: [[ids of texts[i]], ...],
 * add_bos, add_eos} */
static json_t *llama_ids(char *const *files, int n, json_t *texts)
{
    json_t *models = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(models, json_pack("{s:s}", "gguf", files[i]));
    json_t *job = json_pack("{s:o, s:o}", "texts", texts, "models", models);
    char *jpath = th_path(gwh_dir(), "bos-job.json"), *opath = th_path(gwh_dir(), "bos-out.json");
    cr_assert_eq(json_dump_file(job, jpath, 0), 0, "%s", jpath);
    json_decref(job);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "node '%s/tokenize.mjs' '%s' > '%s'", node_dir(), jpath, opath);
    cr_assert_eq(system(cmd), 0, "llama.cpp's tokenizer failed: %s", cmd);
    json_error_t je;
    json_t *out = json_load_file(opath, 0, &je);
    cr_assert_not_null(out, "%s: %s", opath, je.text);
    free(jpath);
    free(opath);
    return out;
}

/* The gateway's file and llama.cpp's hold one vocabulary: every piece the same. */
static void same_vocabulary(const char *a, const char *b)
{
    ringlm_tokenizer *ta, *tb;
    cr_assert_eq(ringlm_tokenizer_load(a, 0, &ta), 0, "%s", ringlm_errdetail());
    cr_assert_eq(ringlm_tokenizer_load(b, 0, &tb), 0, "%s", ringlm_errdetail());
    int n = ringlm_tokenizer_vocab_size(ta);
    cr_assert_eq(n, ringlm_tokenizer_vocab_size(tb));
    for (int32_t id = 0; id < n; id++) {
        const char *pa, *pb;
        cr_assert_eq(ringlm_token_text(ta, 3, id, &pa), 0);
        cr_assert_eq(ringlm_token_text(tb, 3, id, &pb), 0);
        cr_assert_str_eq(pa, pb, "token %d: %s and %s differ", id, a, b);
    }
    cr_assert_eq(ringlm_tokenizer_add_special(ta), ringlm_tokenizer_add_special(tb), "%s, %s", a,
                 b);
    ringlm_tokenizer_free(ta);
    ringlm_tokenizer_free(tb);
}

/* [BOS]? ids [EOS]? as a compact JSON text */
static char *with_special(json_t *ids, bool bos, bool eos)
{
    json_t *a = json_array();
    if (bos) json_array_append_new(a, json_integer(1));
    json_array_extend(a, ids);
    if (eos) json_array_append_new(a, json_integer(2));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

static json_t *post_json(const char *path, const char *body)
{
    gwh_resp r = gwh_curl(path, NULL, body);
    cr_assert_eq(r.status, 200, "%s %s: %d %s", path, body, r.status, r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "%s", r.body);
    gwh_resp_free(&r);
    return j;
}

static char *tokenize(const char *body)
{
    json_t *j = post_json("/tokenize", body);
    char *s = json_dumps(json_object_get(j, "tokens"), JSON_COMPACT);
    json_decref(j);
    return s;
}

static long usage(const char *path, const char *body, const char *key)
{
    json_t *j = post_json(path, body);
    json_t *v = json_object_get(json_object_get(j, "usage"), key);
    cr_assert(json_is_integer(v), "%s: no usage.%s", path, key);
    long n = (long)json_integer_value(v);
    json_decref(j);
    return n;
}

Test(gateway_bos, prompt_ids_add_bos_and_eos_as_the_file_says_like_llama_cpp)
{
    gwh_need();
    gwh_need_curl();
    skip_without_node();
    static const struct {
        bool bos, eos; /* the file's add_bos_token, add_eos_token */
    } cases[] = {{true, false}, {false, false}, {true, true}, {false, true}};
    enum { NC = sizeof cases / sizeof *cases };
    char *files[NC], *models[NC];
    for (int c = 0; c < NC; c++) {
        char name[32];
        snprintf(name, sizeof name, "bos-%d.gguf", c);
        files[c] = gwh_stories_gguf_special(name, tpl, cases[c].bos, cases[c].eos);
        snprintf(name, sizeof name, "bos-model-%d.gguf", c);
        models[c] = stories_model(name, cases[c].bos, cases[c].eos);
        same_vocabulary(files[c], models[c]);
    }
    /* llama.cpp's chat text: tpl's output on the chat below, less a leading BOS text where
     * the vocabulary adds BOS, less a trailing EOS text where it adds EOS */
    const char *chat_texts[4] = {"<s><user>hi there</s>", "<user>hi there</s>", "<s><user>hi there",
                                 "<user>hi there"};
    json_t *out = llama_ids(models, NC,
                            json_pack("[s, s, s, s, s]", prompt, chat_texts[0], chat_texts[1],
                                      chat_texts[2], chat_texts[3]));
    gwh_start_daemon(NULL);
    for (int c = 0; c < NC; c++) {
        json_t *o = json_array_get(out, (size_t)c), *ll = json_object_get(o, "llama");
        const bool bos = cases[c].bos, eos = cases[c].eos;
        cr_assert_eq(json_is_true(json_object_get(o, "add_bos")), bos, "case %d: add_bos", c);
        cr_assert_eq(json_is_true(json_object_get(o, "add_eos")), eos, "case %d: add_eos", c);
        json_t *chat_ids = json_array_get(ll, 1 + (size_t)bos + 2 * (size_t)eos); /* chat_texts */
        char *want_prompt = with_special(json_array_get(ll, 0), bos, eos);
        char *want_chat = with_special(chat_ids, bos, eos);
        /* one BOS at the start of a chat, from the template's text or the tokenizer */
        cr_assert(!strncmp(want_chat, "[1,", 3) && strncmp(want_chat, "[1,1,", 5), "case %d: %s", c,
                  want_chat);
        const char *argv[] = {"--tokenizer", files[c], NULL};
        gwh_start_gateway(argv);
        gwh_wait_healthy(10000);
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\": \"%s\"}", prompt);
        char *got = tokenize(body);
        cr_assert_str_eq(got, want_prompt, "case %d: /tokenize of the prompt", c);
        free(got);
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 1}", prompt);
        long n_want = (long)json_array_size(json_array_get(ll, 0)) + bos + eos;
        cr_assert_eq(usage("/v1/completions", body, "prompt_tokens"), n_want,
                     "case %d: completion's prompt_tokens", c);
        const char *msgs = "[{\"role\": \"user\", \"content\": \"hi there\"}]";
        snprintf(body, sizeof body, "{\"messages\": %s}", msgs);
        got = tokenize(body);
        cr_assert_str_eq(got, want_chat, "case %d: /tokenize of the chat", c);
        free(got);
        n_want = (long)json_array_size(chat_ids) + bos + eos;
        snprintf(body, sizeof body, "{\"messages\": %s, \"max_tokens\": 1}", msgs);
        cr_assert_eq(usage("/v1/chat/completions", body, "prompt_tokens"), n_want,
                     "case %d: chat's prompt_tokens", c);
        snprintf(body, sizeof body, "{\"input\": %s, \"max_output_tokens\": 1}", msgs);
        cr_assert_eq(usage("/v1/responses", body, "input_tokens"), n_want,
                     "case %d: responses' input_tokens", c);
        th_proc_stop(&gwh_gateway, SIGTERM, 10000);
        char *log = th_path(gwh_dir(), "gateway.log"); /* the next one's port is in a new log */
        cr_assert_eq(unlink(log), 0, "%s", log);
        free(log);
        free(want_prompt);
        free(want_chat);
    }
    json_decref(out);
    for (int c = 0; c < NC; c++) {
        free(files[c]);
        free(models[c]);
    }
    cr_log_info("%d vocabulary files: the gateway's prompt ids are llama.cpp's", NC);
}

/* An empty prompt, as llama.cpp's server takes it (tools/server: the prompt tokenized with
 * add_special, and a prompt of no ids answered with nothing generated): where the file adds
 * BOS or EOS, the ids are those and a completion is generated from them (and /tokenize gives
 * them); where it adds neither there are no ids, and the gateway refuses the request with a
 * 400 naming the prompt rather than invent a BOS. */
Test(gateway_bos, an_empty_prompt_is_the_ids_the_file_adds_or_refused)
{
    gwh_need();
    gwh_need_curl();
    static const struct {
        bool bos, eos;
    } cases[] = {{true, false}, {false, false}, {true, true}, {false, true}};
    gwh_start_daemon(NULL);
    for (int c = 0; c < 4; c++) {
        char name[32];
        snprintf(name, sizeof name, "empty-%d.gguf", c);
        char *file = gwh_stories_gguf_special(name, tpl, cases[c].bos, cases[c].eos);
        const char *argv[] = {"--tokenizer", file, NULL};
        gwh_start_gateway(argv);
        gwh_wait_healthy(10000);
        const long n = cases[c].bos + cases[c].eos;
        char want[16];
        snprintf(want, sizeof want, "%s",
                 n == 2 ? "[1,2]"
                 : n    ? (cases[c].bos ? "[1]" : "[2]")
                        : "[]");
        char *got = tokenize("{\"prompt\": \"\"}");
        cr_assert_str_eq(got, want, "case %d: /tokenize of an empty prompt", c);
        free(got);
        const char *body = "{\"prompt\": \"\", \"max_tokens\": 2}";
        if (n) {
            cr_assert_eq(usage("/v1/completions", body, "prompt_tokens"), n,
                         "case %d: the ids the file adds", c);
        } else {
            gwh_resp r = gwh_curl("/v1/completions", NULL, body);
            cr_assert_eq(r.status, 400, "case %d: %d %s", c, r.status, r.body);
            json_t *j = json_loads(r.body, 0, NULL), *err = json_object_get(j, "error");
            const char *param = json_string_value(json_object_get(err, "param")),
                       *msg = json_string_value(json_object_get(err, "message"));
            cr_assert(param && !strcmp(param, "prompt") && msg && strstr(msg, "empty"),
                      "case %d: the error names the empty prompt: %s", c, r.body);
            json_decref(j);
            gwh_resp_free(&r);
        }
        th_proc_stop(&gwh_gateway, SIGTERM, 10000);
        char *log = th_path(gwh_dir(), "gateway.log");
        cr_assert_eq(unlink(log), 0, "%s", log);
        free(log);
        free(file);
    }
}

/* The render flags leave out the template's own leading BOS text and trailing EOS text, and
 * nothing else; they are the tokenizer's flags. */
Test(gateway_bos, the_template_leaves_out_the_bos_and_eos_texts_asked)
{
    ringlm_chat_jinja *t;
    cr_assert_eq(ringlm_chat_jinja_new(tpl, "<s>", "</s>", &t), 0, "%s", ringlm_errdetail());
    const char *vars = "{\"messages\": [{\"role\": \"user\", \"content\": \"</s>hi<s>\"}]}";
    static const char *const want[4] = {"<s><user></s>hi<s></s>", "<user></s>hi<s></s>",
                                        "<s><user></s>hi<s>", "<user></s>hi<s>"};
    for (unsigned f = 0; f < 4; f++) {
        char *text;
        cr_assert_eq(ringlm_chat_jinja_render(t, vars, f, &text), 0, "%s", ringlm_errdetail());
        cr_assert_str_eq(text, want[f], "flags %u", f);
        free(text);
    }
    char *text = NULL;
    cr_assert_eq(ringlm_chat_jinja_render(t, vars, 4, &text), -EINVAL, "an unknown flag");
    cr_assert(strstr(ringlm_errdetail(), "flags"), "%s", ringlm_errdetail());
    cr_assert_null(text);
    ringlm_chat_jinja_free(t);
    cr_assert_eq(RINGLM_CHAT_JINJA_STRIP_BOS | RINGLM_CHAT_JINJA_STRIP_EOS,
                 RINGLM_TOKENIZE_BOS | RINGLM_TOKENIZE_EOS);
}
