/* SPDX-License-Identifier: MIT */
/*
 * The engine against llama2.c's run.c: every greedy run recorded in
 * $RINGLM_SHARED/models/reference-greedy.json gives the same token ids through the paged
 * engine, the recorded logits agree within 1e-4, and the ringlm-run program prints
 * byte-identical stdout.
 */
#include "engine_test_util.h"
#include "run_c_reference.h"
#include "model/tokenizer.h"

#include <jansson.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/helpers.h"

#define SKIP_WITHOUT_SHARED(root)                                                                  \
    do {                                                                                           \
        if (!(root))                                                                               \
            cr_skip_test("no reference data: set RINGLM_SHARED to the folder holding "             \
                         "models/reference-greedy.json and stories260K.bin");                      \
    } while (0)

/* run.c's loop through the engine: the prompt prefilled as one batch, then greedy decode
 * one row per step, until steps positions or BOS. */
Test(engine_ref, greedy_token_ids_of_every_case)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    char mpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    eng_model *m;
    cr_assert_eq(eng_model_load(mpath, &m), 0, "%s", eng_errmsg());
    check_run_c_greedy_cases(m, root);
    eng_model_free(m);
    json_decref(root);
}

/* Positions 0-3 come from one prefill batch asking logits for all four rows; 4-7 from
 * decode steps. */
Test(engine_ref, logits_oracle_within_1e4)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    char mpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    eng_model *m;
    cr_assert_eq(eng_model_load(mpath, &m), 0, "%s", eng_errmsg());
    const eng_model_config *c = eng_model_cfg(m);
    eng *e = ts_engine(m, 8, 4, 2);
    json_t *positions = json_object_get(json_object_get(root, "logits_oracle"), "positions");
    int n_pos = (int)json_array_size(positions);
    cr_assert_eq(n_pos, 8);
    int32_t toks[8];
    for (int p = 0; p < n_pos; p++)
        toks[p] = (int32_t)json_integer_value(
            json_object_get(json_array_get(positions, (size_t)p), "input_token"));
    float *got = calloc((size_t)n_pos * c->vocab_size, sizeof *got);
    int32_t pos_arr[4] = {0, 1, 2, 3}, qs[2] = {0, 4}, len = 4, lrows[4] = {0, 1, 2, 3};
    int32_t table[2] = {5, 2}; /* not the identity, on purpose */
    int64_t slots[4] = {20, 21, 22, 23};
    eng_batch b = {.n_tokens = 4,
                   .tokens = toks,
                   .positions = pos_arr,
                   .slot_mapping = slots,
                   .n_seqs = 1,
                   .query_start = qs,
                   .seq_len = &len,
                   .block_table = table,
                   .block_table_stride = 2,
                   .n_logits = 4,
                   .logits_rows = lrows};
    cr_assert_eq(eng_execute(e, &b, got), 0, "%s", eng_errmsg());
    for (int p = 4; p < n_pos; p++) {
        int32_t pp = p, l = p + 1, zero = 0;
        int64_t slot = (int64_t)table[p / 4] * 4 + p % 4;
        eng_batch d = {.n_tokens = 1,
                       .tokens = &toks[p],
                       .positions = &pp,
                       .slot_mapping = &slot,
                       .n_seqs = 1,
                       .query_start = (int32_t[]){0, 1},
                       .seq_len = &l,
                       .block_table = table,
                       .block_table_stride = 2,
                       .n_logits = 1,
                       .logits_rows = &zero};
        cr_assert_eq(eng_execute(e, &d, got + (size_t)p * c->vocab_size), 0, "%s", eng_errmsg());
    }
    double worst = 0;
    int worst_pos = -1, worst_tok = -1;
    for (int p = 0; p < n_pos; p++) {
        json_t *want = json_object_get(json_array_get(positions, (size_t)p), "logits");
        cr_assert_eq((int)json_array_size(want), c->vocab_size);
        for (int i = 0; i < c->vocab_size; i++) {
            double d = fabs(json_number_value(json_array_get(want, (size_t)i)) -
                            got[(size_t)p * c->vocab_size + i]);
            if (d > worst) {
                worst = d;
                worst_pos = p;
                worst_tok = i;
            }
        }
    }
    cr_assert_leq(worst, 1e-4, "largest logit difference %.3g at position %d token %d", worst,
                  worst_pos, worst_tok);
    free(got);
    eng_destroy(e);
    eng_model_free(m);
    json_decref(root);
}

/* Runs prog with argv, returns its stdout (malloc'd) and exit status. */
static char *run_capture(char *const argv[], size_t *len, int *status)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fds[0], buf + n, cap - n)) > 0) {
        n += (size_t)got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    close(fds[0]);
    waitpid(pid, status, 0);
    *len = n;
    return buf;
}

Test(engine_ref, ringlm_run_stdout_is_byte_identical)
{
    json_t *root = load_reference();
    SKIP_WITHOUT_SHARED(root);
    char *prog = th_program("ringlm-run");
    char mpath[1024], tpath[1024];
    cr_assert_not_null(ts_model_file(mpath, sizeof mpath, "stories260K.bin"));
    cr_assert_not_null(ts_model_file(tpath, sizeof tpath, "tok512.bin"));
    json_t *cases = json_object_get(root, "cases");
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *cs = json_array_get(cases, ci);
        char steps[16];
        snprintf(steps, sizeof steps, "%lld",
                 (long long)json_integer_value(json_object_get(cs, "n_arg")));
        char *argv[] = {prog,
                        "--model",
                        mpath,
                        "--tokenizer",
                        tpath,
                        "--prompt",
                        (char *)json_string_value(json_object_get(cs, "prompt")),
                        "--steps",
                        steps,
                        "--temperature",
                        "0",
                        "--threads",
                        "1",
                        NULL};
        size_t len;
        int status;
        char *out = run_capture(argv, &len, &status);
        const char *want = json_string_value(json_object_get(cs, "stdout"));
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "case %zu: exit status %d", ci,
                  status);
        size_t i = 0;
        while (i < len && want[i] && out[i] == want[i]) i++;
        cr_assert(len == strlen(want) && i == len,
                  "case %zu (%s): stdout differs at byte %zu (got %zu bytes, want %zu)", ci,
                  json_string_value(json_object_get(cs, "command")), i, len, strlen(want));
        free(out);
    }
    json_decref(root);
    free(prog);
}
