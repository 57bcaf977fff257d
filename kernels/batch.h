/* SPDX-License-Identifier: MIT */
/*
 * kernels/batch.h — builds one flattened eng_batch from sequences (DESIGN.md §4).
 *
 * Every caller of the engine used to flatten its sequences by hand (the daemon from the
 * scheduler's plan, its warm-up, the engine tests, the GPU parity checks): one row per
 * token, its position, its KV slot from the sequence's block table, query_start / seq_len
 * per sequence, and a logits row at a sequence's last token. This is that one loop.
 *
 * Lifecycle: eng_bb_init (buffers for max_tokens rows, max_seqs sequences and a block table
 * of bt_stride blocks per sequence) → (eng_bb_reset → eng_bb_add* → eng_bb_batch)* →
 * eng_bb_free. The eng_batch points into the builder: valid until the next reset.
 * Errors: 0 or a negative errno with eng_errmsg() naming the limit.
 */
#ifndef RINGLM_KERNELS_BATCH_H
#define RINGLM_KERNELS_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct eng_batch_builder {
    int max_tokens, max_seqs, bt_stride, block_size;
    int n_tokens, n_seqs, n_logits;
    int32_t *tokens, *positions, *query_start, *seq_len, *block_table, *logits_rows;
    int32_t *rings;      /* [max_seqs]: each sequence's window ring (-1 until eng_bb_set_ring) */
    int32_t *prompt_len; /* [max_seqs]: each sequence's prompt length (0 until eng_bb_set_prompt) */
    int64_t *slots;
    eng_batch batch;
} eng_batch_builder;

/* Buffers for max_tokens rows and max_seqs sequences, each with a block table of bt_stride
 * entries of block_size tokens. 0, -EINVAL (a limit < 1), -ENOMEM. */
int eng_bb_init(eng_batch_builder *b, int max_tokens, int max_seqs, int bt_stride, int block_size);
void eng_bb_free(eng_batch_builder *b);
/* Empties the batch (keeps the buffers). */
void eng_bb_reset(eng_batch_builder *b);
/* Appends one sequence: rows for positions start_pos .. start_pos + n_rows - 1, whose tokens
 * are seq_tokens[pos] (the sequence's tokens from position 0); its KV slots come from
 * blocks[0 .. n_blocks) (the rest of its table row is 0); seq_len = start_pos + n_rows. With
 * logits, its last row gets the next logits row (n_logits - 1 after the call), whose logits
 * eng_execute writes and eng_execute_sample samples.
 * Returns 0, -ENOSPC (rows or sequences full), -EINVAL (n_rows 0, more blocks than
 * bt_stride, or the blocks do not cover the last position); the batch is unchanged on
 * error. */
int eng_bb_add(eng_batch_builder *b, const int32_t *seq_tokens, uint32_t start_pos, uint32_t n_rows,
               const int32_t *blocks, uint32_t n_blocks, bool logits);
/* eng_bb_add with logits rows for the last n_logits rows (0 .. n_rows), in order: a
 * prompt whose log-probabilities are wanted needs the logits of each of its rows, the last
 * of which is the one sampled. -EINVAL also when n_logits > n_rows. */
int eng_bb_add_logits(eng_batch_builder *b, const int32_t *seq_tokens, uint32_t start_pos,
                      uint32_t n_rows, const int32_t *blocks, uint32_t n_blocks, uint32_t n_logits);
/* The last logits row n more times (n samples drawn from one row: each repeat is a logits
 * row of its own, sampled with its own eng_sampling and rng). The batch's logits rows stay
 * at most its token rows: -ENOSPC when n_logits + n would pass n_tokens, -EINVAL when there
 * is no logits row yet; the batch is unchanged on error. */
int eng_bb_repeat_logits(eng_batch_builder *b, uint32_t n);
/* The window ring (eng_options.kv_rings) of the sequence added last. -EINVAL when none was
 * added or ring < 0. */
int eng_bb_set_ring(eng_batch_builder *b, int32_t ring);
/* The prompt length of the sequence added last (eng_batch.prompt_len): its rows at positions
 * below n_prompt are prompt rows. A sequence whose prompt is not set has none (every row
 * exact float32). -EINVAL when none was added. */
int eng_bb_set_prompt(eng_batch_builder *b, uint32_t n_prompt);
/* The batch built so far (query_start closed). Valid until the next reset or add. */
const eng_batch *eng_bb_batch(eng_batch_builder *b);

#ifdef __cplusplus
}
#endif

#endif
