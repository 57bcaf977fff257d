/* SPDX-License-Identifier: MIT */
/*
 * tests/run_c_reference.h — llama2.c's run.c as the oracle (header only, like
 * engine_test_util.h): its recorded runs on stories260K ($RINGLM_SHARED/models/
 * reference-greedy.json) and the greedy loop that must give the very tokens it recorded.
 */
#ifndef RINGLM_TESTS_RUN_C_REFERENCE_H
#define RINGLM_TESTS_RUN_C_REFERENCE_H

#include "engine_test_util.h"

#include <jansson.h>

/* reference-greedy.json parsed (json_decref it); NULL when the file is absent. */
static inline json_t *load_reference(void)
{
    char path[1024];
    if (!ts_model_file(path, sizeof path, "reference-greedy.json")) return NULL;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    cr_assert_not_null(root, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return root;
}

/* A JSON array of integers into out (more than max fails the test); returns their count. */
static inline int ints_of(json_t *arr, int32_t *out, int max)
{
    int n = (int)json_array_size(arr);
    cr_assert_leq(n, max);
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return n;
}

/* run.c's loop through engine e on m for every recorded case of root: the prompt prefilled
 * as one batch (its rows marked as a prompt's where mark_prompt: the daemon's batches), then
 * greedy decode one row per step, until the case's steps positions or BOS. The tokens, and
 * whether it stopped on BOS, equal what run.c recorded. */
static inline void check_run_c_greedy_cases_on(eng *e, eng_model *m, json_t *root, bool mark_prompt)
{
    const eng_model_config *c = eng_model_cfg(m);
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    json_t *cases = json_object_get(root, "cases");
    cr_assert_eq(json_array_size(cases), 12);
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *cs = json_array_get(cases, ci);
        const char *command = json_string_value(json_object_get(cs, "command"));
        int32_t prompt[64], expect[600];
        int n_prompt = ints_of(json_object_get(cs, "prompt_tokens"), prompt, 64);
        int n_expect = ints_of(json_object_get(cs, "generated_tokens"), expect, 600);
        int steps = (int)json_integer_value(json_object_get(cs, "effective_steps"));
        bool stop_bos = json_is_true(json_object_get(cs, "stopped_on_bos"));
        tseq s;
        ts_seq_init(&s, prompt, n_prompt, 0);
        s.n_prompt = mark_prompt ? n_prompt : 0;
        tseq *one[1] = {&s};
        int rows = n_prompt, pos = n_prompt - 1, n_gen = 0;
        bool stopped = false;
        cr_assert_eq(ts_step(e, c, one, &rows, 1, logits), 0, "%s", eng_errmsg());
        while (pos < steps) {
            if (s.n_cached < s.n_tokens) {
                rows = 1;
                cr_assert_eq(ts_step(e, c, one, &rows, 1, logits), 0, "%s", eng_errmsg());
            }
            int32_t next = ts_argmax(logits, c->vocab_size);
            pos++;
            if (next == 1) {
                stopped = true;
                break;
            }
            cr_assert_lt(n_gen, n_expect, "case %zu (%s): generated more than the %d recorded", ci,
                         command, n_expect);
            cr_assert_eq(next, expect[n_gen], "case %zu (%s): token %d is %d, run.c chose %d", ci,
                         command, n_gen, next, expect[n_gen]);
            s.tokens[s.n_tokens++] = next;
            n_gen++;
        }
        cr_assert_eq(n_gen, n_expect, "case %zu: %d tokens, run.c made %d", ci, n_gen, n_expect);
        cr_assert_eq(stopped, stop_bos, "case %zu: stopped on BOS %d, run.c %d", ci, stopped,
                     stop_bos);
    }
    free(logits);
}

/* check_run_c_greedy_cases_on an engine of its own, rows unmarked: exact float32. */
static inline void check_run_c_greedy_cases(eng_model *m, json_t *root)
{
    eng *e = ts_engine(m, 40, 16, 1);
    check_run_c_greedy_cases_on(e, m, root, false);
    eng_destroy(e);
}

#endif
