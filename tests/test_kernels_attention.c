/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend's paged attention (kernels/cpu/attention.c) alone, one layer, against a
 * plain double-precision softmax(q·k / sqrt(d)) · V over each row's visible positions read
 * through the block table: the tiled prefill path (tiles of TILE_ROWS rows of one
 * sequence) and the per-row path (every row a tile of its own, as decode rows go) both
 * within 2e-5 of it. K/V are random behind scattered block tables (perf/attn_case.h); the
 * cases cover lengths that fill no block or tile evenly, GQA groups that do not divide a
 * vector of queries, head sizes off the vector width, blocks of 1 and 3, sliding windows,
 * soft-capping, chunks that start mid-block and mid-tile after cached positions, decode
 * rows and prefill chunks of several sequences in one batch, and sharp score
 * distributions whose maximum moves along the keys. The worker count never changes a bit
 * of the result.
 */
#include "perf/attn_case.h"

#include <criterion/criterion.h>
#include <math.h>

#define TOL      2e-5
/* Prompt rows through attention_bf16.c: scores in float32, the softmax's weights P and the
 * values V rounded to bf16 (2^-9 of each, relative) and P·V summed in float32, so an output
 * is off by at most about 2^-8 of Σ p·|v| / Σ p, 3.9e-3 for these |v| <= 1: measured 3.1e-4
 * to 2.6e-3. */
#define TOL_BF16 5e-3

/* out = softmax over the visible positions of q·k * scale (soft-capped), times V, in double */
static void reference(const attn_run *r, int seq, int row, int h, double *out)
{
    const cpu *c = &r->c;
    const int hs = c->head_size, bs = c->block_size, kvh = h / c->group;
    const int pos = r->positions[row];
    const int lo = c->window && pos + 1 > c->window ? pos + 1 - c->window : 0;
    const float *q = c->q + (size_t)row * c->q_dim + (size_t)h * hs;
    const int32_t *table = r->table + (size_t)seq * r->stride;
    double *s = malloc((size_t)(pos + 1) * sizeof *s), max = -INFINITY, sum = 0;
    for (int t = lo; t <= pos; t++) {
        const float *k = kv_at(c, table[t / bs], 0, 0, t % bs) + (size_t)kvh * hs;
        double d = 0;
        for (int j = 0; j < hs; j++) d += (double)q[j] * k[j];
        d /= c->att_div;
        if (c->hp.attn_softcap > 0) d = c->hp.attn_softcap * tanh(d / c->hp.attn_softcap);
        s[t] = d;
        if (d > max) max = d;
    }
    for (int t = lo; t <= pos; t++) sum += (s[t] = exp(s[t] - max));
    for (int j = 0; j < hs; j++) out[j] = 0;
    for (int t = lo; t <= pos; t++) {
        const float *v = kv_at(c, table[t / bs], 0, 1, t % bs) + (size_t)kvh * hs;
        for (int j = 0; j < hs; j++) out[j] += s[t] / sum * v[j];
    }
    free(s);
}

/* Largest |att - reference| over rows row_lo .. row_hi - 1 of the batch, every query head. */
static double max_err_rows(const attn_run *r, int row_lo, int row_hi)
{
    double worst = 0, *ref = malloc((size_t)r->c.head_size * sizeof *ref);
    for (int s = 0; s < r->b.n_seqs; s++)
        for (int row = r->query_start[s]; row < r->query_start[s + 1]; row++)
            for (int h = 0; h < r->ac.n_heads && row >= row_lo && row < row_hi; h++) {
                reference(r, s, row, h, ref);
                const float *got = attn_run_out(r, row, h);
                for (int j = 0; j < r->c.head_size; j++) {
                    double e = fabs(got[j] - ref[j]);
                    if (e != e) e = INFINITY; /* NaN: as far off as can be */
                    if (e > worst) worst = e;
                }
            }
    free(ref);
    return worst;
}

/* Largest |att - reference| over every row and query head. */
static double max_err(const attn_run *r)
{
    return max_err_rows(r, 0, r->n_rows);
}

/* The case's rows as prompt rows through the BF16 path (attention_bf16.c), where the CPU has
 * it: within TOL_BF16 of the reference; the same bits in tiles of TILE_ROWS, 7 and 1 rows
 * (a row's block-mates, as its batch and its prompt's chunking choose them, change nothing)
 * and with 1 or 2 workers; and with only the first half of the rows marked as prompt rows
 * (tiles of prompt rows then generated rows), the first half keeps those bits and the rest
 * take the float path, within TOL. */
static void check_prompt(const char *what, attn_case ac)
{
    if (!gemm_bf16_supported()) return;
    size_t n_out = 0;
    float *first = NULL;
    ac.attn_bf16 = 1;
    for (int threads = 1; threads <= 2; threads++) {
        ac.threads = threads;
        attn_run r;
        cr_assert_eq(attn_run_init(&r, &ac), 0, "%s: cannot set up", what);
        n_out = (size_t)r.n_rows * r.c.q_dim;
        r.c.att_prompt_rows = r.n_rows;
        const int tile_rows[] = {TILE_ROWS, 7, 1};
        for (int ti = 0; ti < 3; ti++) {
            attn_run_tiles(&r, tile_rows[ti]);
            memset(r.c.att, 0, n_out * sizeof(float));
            cpu_attention(&r.c);
            if (!first) {
                const double err = max_err(&r);
                cr_log_info("%s: BF16 prompt path %.2g from the reference", what, err);
                cr_assert_leq(err, TOL_BF16, "%s: BF16 prompt path off the reference by %.3g", what,
                              err);
                first = malloc(n_out * sizeof *first);
                memcpy(first, r.c.att, n_out * sizeof *first);
                continue;
            }
            for (int row = 0; row < r.n_rows; row++) {
                const size_t at = (size_t)row * r.c.q_dim;
                cr_assert(memcmp(first + at, r.c.att + at, (size_t)r.c.q_dim * sizeof(float)) == 0,
                          "%s, %d thread(s): prompt row %d in tiles of %d gives other bits than "
                          "in tiles of %d",
                          what, threads, row, tile_rows[ti], TILE_ROWS);
            }
        }
        const int half = r.n_rows / 2;
        r.c.att_prompt_rows = half;
        attn_run_tiles(&r, TILE_ROWS);
        memset(r.c.att, 0, n_out * sizeof(float));
        cpu_attention(&r.c);
        cr_assert(memcmp(first, r.c.att, (size_t)half * r.c.q_dim * sizeof(float)) == 0,
                  "%s, %d thread(s): prompt rows beside generated rows give other bits", what,
                  threads);
        const double rest = max_err_rows(&r, half, r.n_rows);
        cr_assert_leq(rest, TOL,
                      "%s, %d thread(s): generated rows after prompt rows off the "
                      "reference by %.3g",
                      what, threads, rest);
        attn_run_free(&r);
    }
    free(first);
}

/* The case through the tiled and the per-row path, with 1 and 2 workers: each within TOL of
 * the reference, and the workers change nothing. */
static void check(const char *what, attn_case ac)
{
    size_t n_out = 0;
    float *first = NULL;
    for (int threads = 1; threads <= 2; threads++) {
        ac.threads = threads;
        attn_run r;
        cr_assert_eq(attn_run_init(&r, &ac), 0, "%s: cannot set up", what);
        n_out = (size_t)r.n_rows * r.c.q_dim;
        cpu_attention(&r.c);
        double tiled = max_err(&r);
        cr_assert_leq(tiled, TOL, "%s, %d thread(s): tiled path off the reference by %.3g", what,
                      threads, tiled);
        if (threads == 1) {
            first = malloc(n_out * sizeof *first);
            memcpy(first, r.c.att, n_out * sizeof *first);
        } else {
            cr_assert(memcmp(first, r.c.att, n_out * sizeof *first) == 0,
                      "%s: 2 workers give other bits than 1", what);
        }
        attn_run_tiles(&r, 1);
        memset(r.c.att, 0, n_out * sizeof(float));
        cpu_attention(&r.c);
        double per_row = max_err(&r);
        cr_assert_leq(per_row, TOL, "%s, %d thread(s): per-row path off the reference by %.3g",
                      what, threads, per_row);
        cr_log_info("%s, %d thread(s): tiled %.2g, per-row %.2g from the reference", what, threads,
                    tiled, per_row);
        attn_run_free(&r);
    }
    free(first);
    check_prompt(what, ac);
}

#define ONE(ctx0, rows0) .n_seqs = 1, .ctx = {ctx0}, .rows = {rows0}

Test(kernels_attention, whole_prompts_of_odd_lengths)
{
    check("MHA 64, 100 rows", (attn_case){.head_size = 64,
                                          .n_heads = 4,
                                          .n_kv_heads = 4,
                                          .block_size = 16,
                                          ONE(0, 100),
                                          .seed = 1});
    check("MHA 64, 2 rows", (attn_case){.head_size = 64,
                                        .n_heads = 2,
                                        .n_kv_heads = 2,
                                        .block_size = 16,
                                        ONE(0, 2),
                                        .seed = 2});
    check("MHA 8, 37 rows", (attn_case){.head_size = 8,
                                        .n_heads = 8,
                                        .n_kv_heads = 8,
                                        .block_size = 16,
                                        ONE(0, 37),
                                        .seed = 3});
    check("MHA 64, 17 rows, blocks of 1", (attn_case){.head_size = 64,
                                                      .n_heads = 2,
                                                      .n_kv_heads = 2,
                                                      .block_size = 1,
                                                      ONE(0, 17),
                                                      .seed = 4});
}

Test(kernels_attention, gqa_groups_and_head_sizes_off_the_vector_width)
{
    check("GQA 4, head 32", (attn_case){.head_size = 32,
                                        .n_heads = 8,
                                        .n_kv_heads = 2,
                                        .block_size = 16,
                                        ONE(0, 77),
                                        .seed = 5});
    check("GQA 3, head 20, blocks of 3", (attn_case){.head_size = 20,
                                                     .n_heads = 6,
                                                     .n_kv_heads = 2,
                                                     .block_size = 3,
                                                     ONE(0, 41),
                                                     .seed = 6});
    check("GQA 7, head 12", (attn_case){.head_size = 12,
                                        .n_heads = 7,
                                        .n_kv_heads = 1,
                                        .block_size = 8,
                                        ONE(0, 29),
                                        .seed = 7});
    check("GQA 2, head 128", (attn_case){.head_size = 128,
                                         .n_heads = 4,
                                         .n_kv_heads = 2,
                                         .block_size = 16,
                                         ONE(0, 70),
                                         .seed = 8});
    check("GQA 16, head 8", (attn_case){.head_size = 8,
                                        .n_heads = 16,
                                        .n_kv_heads = 1,
                                        .block_size = 16,
                                        ONE(0, 9),
                                        .seed = 9});
}

Test(kernels_attention, chunks_after_cached_positions)
{
    check("33 rows after 45", (attn_case){.head_size = 64,
                                          .n_heads = 2,
                                          .n_kv_heads = 2,
                                          .block_size = 16,
                                          ONE(45, 33),
                                          .seed = 10});
    check("2 rows after 17", (attn_case){.head_size = 64,
                                         .n_heads = 2,
                                         .n_kv_heads = 2,
                                         .block_size = 16,
                                         ONE(17, 2),
                                         .seed = 11});
    check("GQA 4, 7 rows after 130", (attn_case){.head_size = 32,
                                                 .n_heads = 8,
                                                 .n_kv_heads = 2,
                                                 .block_size = 16,
                                                 ONE(130, 7),
                                                 .seed = 12});
    check("64 rows after 200, blocks of 3", (attn_case){.head_size = 16,
                                                        .n_heads = 2,
                                                        .n_kv_heads = 1,
                                                        .block_size = 3,
                                                        ONE(200, 64),
                                                        .seed = 13});
}

Test(kernels_attention, sliding_windows)
{
    check("window 8, 50 rows", (attn_case){.head_size = 64,
                                           .n_heads = 2,
                                           .n_kv_heads = 2,
                                           .block_size = 16,
                                           .window = 8,
                                           ONE(0, 50),
                                           .seed = 14});
    check("window 13, 21 rows after 40", (attn_case){.head_size = 32,
                                                     .n_heads = 4,
                                                     .n_kv_heads = 2,
                                                     .block_size = 16,
                                                     .window = 13,
                                                     ONE(40, 21),
                                                     .seed = 15});
    check("window 100, 90 rows", (attn_case){.head_size = 32,
                                             .n_heads = 2,
                                             .n_kv_heads = 1,
                                             .block_size = 16,
                                             .window = 100,
                                             ONE(0, 90),
                                             .seed = 16});
    check("window 1, 20 rows, blocks of 3", (attn_case){.head_size = 16,
                                                        .n_heads = 3,
                                                        .n_kv_heads = 3,
                                                        .block_size = 3,
                                                        .window = 1,
                                                        ONE(5, 20),
                                                        .seed = 17});
    check("window 70, 150 rows after 10", (attn_case){.head_size = 64,
                                                      .n_heads = 2,
                                                      .n_kv_heads = 2,
                                                      .block_size = 16,
                                                      .window = 70,
                                                      ONE(10, 150),
                                                      .seed = 18});
}

Test(kernels_attention, soft_capped_and_sharp_scores)
{
    check("soft-cap 5, sharp", (attn_case){.head_size = 64,
                                           .n_heads = 4,
                                           .n_kv_heads = 2,
                                           .block_size = 16,
                                           .softcap = 5.0f,
                                           .q_amp = 6.0f,
                                           ONE(0, 60),
                                           .seed = 19});
    check("soft-cap 50, window 8", (attn_case){.head_size = 32,
                                               .n_heads = 2,
                                               .n_kv_heads = 1,
                                               .block_size = 16,
                                               .softcap = 50.0f,
                                               .window = 8,
                                               ONE(3, 40),
                                               .seed = 20});
    check("sharp, 300 rows", (attn_case){.head_size = 64,
                                         .n_heads = 2,
                                         .n_kv_heads = 2,
                                         .block_size = 16,
                                         .q_amp = 8.0f,
                                         ONE(0, 300),
                                         .seed = 21});
    check("own scale, 90 rows", (attn_case){.head_size = 32,
                                            .n_heads = 2,
                                            .n_kv_heads = 2,
                                            .block_size = 16,
                                            .att_scale = 0.5f,
                                            ONE(0, 90),
                                            .seed = 22});
}

Test(kernels_attention, decode_rows_and_chunks_of_several_sequences_in_one_batch)
{
    check("mixed batch", (attn_case){.head_size = 32,
                                     .n_heads = 8,
                                     .n_kv_heads = 2,
                                     .block_size = 16,
                                     .n_seqs = 4,
                                     .ctx = {30, 0, 20, 5},
                                     .rows = {1, 40, 7, 1},
                                     .seed = 23});
    check("mixed batch, window 9", (attn_case){.head_size = 64,
                                               .n_heads = 2,
                                               .n_kv_heads = 2,
                                               .block_size = 4,
                                               .window = 9,
                                               .n_seqs = 3,
                                               .ctx = {0, 33, 12},
                                               .rows = {35, 1, 19},
                                               .seed = 24});
}

/* The case's rows as decode rows (a tile each), all in one batch and then each alone: a
 * decode item takes all of a row's KV heads in a batch of many rows and a few of them when
 * the row is alone (so that one row still spreads over the workers), and neither may change
 * a bit of the row. */
static void check_alone(const char *what, attn_case ac)
{
    for (int threads = 1; threads <= 2; threads++) {
        ac.threads = threads;
        attn_run r;
        cr_assert_eq(attn_run_init(&r, &ac), 0, "%s: cannot set up", what);
        attn_run_tiles(&r, 1);
        const size_t n_out = (size_t)r.n_rows * r.c.q_dim;
        cpu_attention(&r.c);
        const double err = max_err(&r);
        cr_assert_leq(err, TOL, "%s, %d thread(s): batch off the reference by %.3g", what, threads,
                      err);
        float *batch = malloc(n_out * sizeof *batch);
        struct tile *tiles = malloc((size_t)r.c.n_tiles * sizeof *tiles);
        memcpy(batch, r.c.att, n_out * sizeof *batch);
        memcpy(tiles, r.c.tiles, (size_t)r.c.n_tiles * sizeof *tiles);
        const int n_tiles = r.c.n_tiles;
        for (int t = 0; t < n_tiles; t++) {
            r.c.n_tiles = 1;
            r.c.tiles[0] = tiles[t];
            memset(r.c.att, 0, n_out * sizeof(float));
            cpu_attention(&r.c);
            const size_t at = (size_t)tiles[t].row0 * r.c.q_dim;
            cr_assert(memcmp(batch + at, r.c.att + at, (size_t)r.c.q_dim * sizeof(float)) == 0,
                      "%s, %d thread(s): row %d alone gives other bits than in the batch of %d",
                      what, threads, tiles[t].row0, n_tiles);
        }
        free(tiles);
        free(batch);
        attn_run_free(&r);
    }
}

Test(kernels_attention, a_decode_row_alone_gives_the_bits_it_gets_among_many)
{
    check_alone("12 heads of 64", (attn_case){.head_size = 64,
                                              .n_heads = 12,
                                              .n_kv_heads = 12,
                                              .block_size = 16,
                                              .n_seqs = 8,
                                              .ctx = {0, 5, 16, 31, 47, 64, 100, 129},
                                              .rows = {1, 1, 1, 1, 1, 1, 1, 1},
                                              .seed = 25});
    check_alone("GQA 8/2 of 40, window 20, soft-capped", (attn_case){.head_size = 40,
                                                                     .n_heads = 8,
                                                                     .n_kv_heads = 2,
                                                                     .block_size = 3,
                                                                     .window = 20,
                                                                     .softcap = 30.0f,
                                                                     .n_seqs = 6,
                                                                     .ctx = {1, 19, 20, 21, 50, 77},
                                                                     .rows = {1, 1, 1, 1, 1, 1},
                                                                     .seed = 26});
    /* 24 KV heads' scores over 3000 positions do not fit one worker's scratch: in the batch
     * (one worker) a row's heads go in two passes */
    check_alone("24 heads of 36 over 3000 positions", (attn_case){.head_size = 36,
                                                                  .n_heads = 24,
                                                                  .n_kv_heads = 24,
                                                                  .block_size = 16,
                                                                  .n_seqs = 3,
                                                                  .ctx = {2999, 7, 1500},
                                                                  .rows = {1, 1, 1},
                                                                  .seed = 27});
}
