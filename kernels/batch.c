/* SPDX-License-Identifier: MIT */
/*
 * kernels/batch.c — the one place sequences are flattened into an eng_batch. See batch.h.
 */
#include "kernels/batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int eng_bb_init(eng_batch_builder *b, int max_tokens, int max_seqs, int bt_stride, int block_size)
{
    memset(b, 0, sizeof *b);
    if (max_tokens < 1 || max_seqs < 1 || bt_stride < 1 || block_size < 1)
        return eng_seterr(-EINVAL,
                          "batch builder: %d tokens, %d sequences, %d blocks of %d: "
                          "each must be >= 1",
                          max_tokens, max_seqs, bt_stride, block_size);
    size_t T = (size_t)max_tokens, S = (size_t)max_seqs;
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->bt_stride = bt_stride;
    b->block_size = block_size;
    b->tokens = calloc(T, sizeof(int32_t));
    b->positions = calloc(T, sizeof(int32_t));
    b->slots = calloc(T, sizeof(int64_t));
    b->query_start = calloc(S + 1, sizeof(int32_t));
    b->seq_len = calloc(S, sizeof(int32_t));
    b->block_table = calloc(S * (size_t)bt_stride, sizeof(int32_t));
    b->logits_rows = calloc(T, sizeof(int32_t)); /* a prompt's log-probabilities: every row */
    b->rings = calloc(S, sizeof(int32_t));
    b->prompt_len = calloc(S, sizeof(int32_t));
    if (!b->tokens || !b->positions || !b->slots || !b->query_start || !b->seq_len ||
        !b->block_table || !b->logits_rows || !b->rings || !b->prompt_len) {
        eng_bb_free(b);
        return eng_seterr(-ENOMEM, "batch builder: out of memory for %d tokens, %d sequences",
                          max_tokens, max_seqs);
    }
    return 0;
}

void eng_bb_free(eng_batch_builder *b)
{
    free(b->tokens);
    free(b->positions);
    free(b->slots);
    free(b->query_start);
    free(b->seq_len);
    free(b->block_table);
    free(b->logits_rows);
    free(b->rings);
    free(b->prompt_len);
    memset(b, 0, sizeof *b);
}

void eng_bb_reset(eng_batch_builder *b)
{
    b->n_tokens = b->n_seqs = b->n_logits = 0;
}

int eng_bb_add(eng_batch_builder *b, const int32_t *seq_tokens, uint32_t start_pos, uint32_t n_rows,
               const int32_t *blocks, uint32_t n_blocks, bool logits)
{
    return eng_bb_add_logits(b, seq_tokens, start_pos, n_rows, blocks, n_blocks, logits ? 1 : 0);
}

int eng_bb_add_logits(eng_batch_builder *b, const int32_t *seq_tokens, uint32_t start_pos,
                      uint32_t n_rows, const int32_t *blocks, uint32_t n_blocks, uint32_t n_logits)
{
    const uint32_t bs = (uint32_t)b->block_size;
    if (n_rows == 0 || n_logits > n_rows || n_blocks > (uint32_t)b->bt_stride ||
        (uint64_t)n_blocks * bs < (uint64_t)start_pos + n_rows)
        return eng_seterr(-EINVAL,
                          "batch builder: %u rows (%u with logits) from position %u with %u "
                          "blocks of %u (table of %d)",
                          n_rows, n_logits, start_pos, n_blocks, bs, b->bt_stride);
    if (b->n_seqs >= b->max_seqs || (uint64_t)b->n_tokens + n_rows > (uint64_t)b->max_tokens)
        return eng_seterr(-ENOSPC, "batch builder: %u more rows on %d of %d, sequence %d of %d",
                          n_rows, b->n_tokens, b->max_tokens, b->n_seqs + 1, b->max_seqs);
    int S = b->n_seqs, T = b->n_tokens;
    b->query_start[S] = T;
    for (uint32_t k = 0; k < n_rows; k++, T++) {
        uint32_t pos = start_pos + k;
        b->tokens[T] = seq_tokens[pos];
        b->positions[T] = (int32_t)pos;
        b->slots[T] = (int64_t)blocks[pos / bs] * bs + pos % bs;
    }
    b->seq_len[S] = (int32_t)(start_pos + n_rows);
    b->rings[S] = -1;
    b->prompt_len[S] = 0;
    int32_t *row = b->block_table + (size_t)S * (size_t)b->bt_stride;
    memcpy(row, blocks, sizeof(int32_t) * n_blocks);
    memset(row + n_blocks, 0, sizeof(int32_t) * ((size_t)b->bt_stride - n_blocks));
    b->n_tokens = T;
    b->n_seqs = S + 1;
    for (uint32_t k = n_logits; k > 0; k--) b->logits_rows[b->n_logits++] = T - (int32_t)k;
    return 0;
}

int eng_bb_repeat_logits(eng_batch_builder *b, uint32_t n)
{
    if (b->n_logits < 1) return eng_seterr(-EINVAL, "batch builder: no logits row to repeat");
    if ((uint64_t)b->n_logits + n > (uint64_t)b->n_tokens)
        return eng_seterr(-ENOSPC, "batch builder: %u more logits rows on %d for %d rows", n,
                          b->n_logits, b->n_tokens);
    int32_t row = b->logits_rows[b->n_logits - 1];
    for (uint32_t k = 0; k < n; k++) b->logits_rows[b->n_logits++] = row;
    return 0;
}

int eng_bb_set_ring(eng_batch_builder *b, int32_t ring)
{
    if (b->n_seqs < 1 || ring < 0)
        return eng_seterr(-EINVAL, "batch builder: ring %d for sequence %d", ring, b->n_seqs - 1);
    b->rings[b->n_seqs - 1] = ring;
    return 0;
}

int eng_bb_set_prompt(eng_batch_builder *b, uint32_t n_prompt)
{
    if (b->n_seqs < 1 || n_prompt > INT32_MAX)
        return eng_seterr(-EINVAL, "batch builder: prompt of %u for sequence %d", n_prompt,
                          b->n_seqs - 1);
    b->prompt_len[b->n_seqs - 1] = (int32_t)n_prompt;
    return 0;
}

const eng_batch *eng_bb_batch(eng_batch_builder *b)
{
    b->query_start[b->n_seqs] = b->n_tokens;
    b->batch = (eng_batch){.n_tokens = b->n_tokens,
                           .tokens = b->tokens,
                           .positions = b->positions,
                           .slot_mapping = b->slots,
                           .n_seqs = b->n_seqs,
                           .query_start = b->query_start,
                           .seq_len = b->seq_len,
                           .block_table = b->block_table,
                           .block_table_stride = b->bt_stride,
                           .n_logits = b->n_logits,
                           .logits_rows = b->logits_rows,
                           .ring = b->rings,
                           .prompt_len = b->prompt_len};
    return &b->batch;
}
