/* SPDX-License-Identifier: MIT */
/*
 * sched/sched_testing.h — the scheduler's test-only entry points. Not part of sched.h's API:
 * no policy key or sched_config field reaches them, and the daemon calls them only for a knob
 * that its test build alone can set (ringlmd-test; ringlmd has no such flag).
 *
 * The constant block key. XXH3 keys every cached block by its whole prefix (DESIGN §10).
 * The constant key gives every block the same key: every lookup and insert then meets every
 * cached block in one hash chain, and only the stored token ids, salt and parent tell them
 * apart. It exists so tests can show, through the whole daemon (ringlmd-test --prefix-key
 * constant), that a collision costs a miss and never reuses a wrong block; lookups cost
 * O(cached blocks) under it.
 */
#ifndef RINGLM_SCHED_TESTING_H
#define RINGLM_SCHED_TESTING_H

#include <stdint.h>

#include "sched/prefix.h"
#include "sched/sched.h"

typedef enum sched_prefix_key_fn {
    SCHED_PREFIX_KEY_XXH3 = 0, /* "xxh3": XXH3-128 of (parent key, salt, tokens) */
    SCHED_PREFIX_KEY_CONSTANT, /* "constant": every block {1, 1} */
    SCHED_PREFIX_KEY__COUNT
} sched_prefix_key_fn;

/* "xxh3", "constant"; "?" out of range. */
const char *sched_prefix_key_fn_name(sched_prefix_key_fn f);

/* Keys s's cached blocks with fn from now on. Call it after sched_create, before the first
 * sched_submit. Errors (sched_last_error names prefix_key): -EINVAL for an unknown fn, or
 * the constant key beside a class whose prefix_order is longest_prefix (that order follows
 * waiting requests by key alone: under a key that names no block it would count any block
 * inserted as every waiter's next one); -EBUSY once a request was submitted. */
int sched_testing_set_prefix_key(sched *s, sched_prefix_key_fn fn);

/* sched_prefix_block_key and sched_prefix_keys (prefix.h) with the key function chosen:
 * those two are these with SCHED_PREFIX_KEY_XXH3. An unknown fn keys like XXH3. */
sched_prefix_key sched_prefix_block_key_with(sched_prefix_key_fn fn, sched_prefix_key parent,
                                             uint64_t salt, const int32_t *tokens, uint32_t n);
uint32_t sched_prefix_keys_with(sched_prefix_key_fn fn, uint64_t salt, const int32_t *tokens,
                                uint32_t n_tokens, uint32_t block_size, sched_prefix_key *out,
                                uint32_t max_out);

#endif
