/* SPDX-License-Identifier: MIT */
/*
 * constrain/cst.h — the constraint engine: a JSON Schema, `json_object`, a regular
 * expression, a GBNF grammar (llama.cpp's format) or a choice among strings compiled into
 * a matcher over a model's token vocabulary. Given the tokens so far, a matcher answers
 * which tokens may come next as a bitmask (bit t of word t / 32); the end tokens (EOS,
 * EOT) are allowed only where the grammar can end.
 *
 * Design (DESIGN.md §14). Every constraint compiles to one program for a small virtual
 * machine over bytes: byte-set steps, splits, jumps, and calls/returns to subroutines, so
 * recursive grammars ($ref, any JSON value) are exact, not unrolled. A matcher runs the
 * program as a Pike VM whose threads carry a hash-consed return stack; the set of threads
 * after some input is a state of a lazily built DFA (RE2's idea, extended with the stacks),
 * so a byte step is one table lookup once warm. The vocabulary is a byte trie laid out in
 * depth-first order; a mask walks it once, skipping every subtree whose prefix is dead, and
 * is cached per DFA state. Inside a run of plain characters (a string's body, bounded or
 * not) the mask is split instead of walked: each token is its plain characters and a tail
 * (from its first quote, backslash, control or non-UTF-8 byte); a token of plain
 * characters only is allowed by its length against the run, and an impure one by its tail
 * from the run's state after its plain characters, the tails' walks (a small trie of their
 * own) cached per state; a run whose first character may be any but a few (a key beside
 * additionalProperties) is split so too, the tokens that begin with those few walked. A
 * class of ASCII bytes under a repeat (a pattern's, a format's) is "classed": a token that
 * begins in the class is allowed by its leading bytes in the class along the class's chain
 * of states and the rest stepped from there (the vocabulary split by the class once per
 * matcher). What the program cannot enforce exactly is a compile error that
 * names the keyword and the JSON pointer; where a looser grammar would be the easy way
 * out, the engine is stricter instead (e.g. object properties in the schema's order,
 * strings in the one form Python's json.dumps writes), never looser: an accepted text
 * always validates.
 *
 * Pure: no I/O, no threads, no clocks. A compiled grammar and a vocabulary are immutable
 * and may be shared by any number of threads; a matcher belongs to one thread at a time.
 *
 * Errors: functions return 0 or a negative errno; compile errors are -EINVAL with the
 * detail written to the caller's buffer ("keyword 'not' at /properties/a: not supported").
 */
#ifndef RINGLM_CONSTRAIN_CST_H
#define RINGLM_CONSTRAIN_CST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compile bounds: a grammar whose program would exceed this many instructions is refused
 * with -E2BIG ("grammar too large"), before it takes the memory. */
#define CST_MAX_PROGRAM      (1u << 21)
/* Inputs longer than this (schema text, regex, all choices together) are refused (-E2BIG). */
#define CST_MAX_SOURCE_BYTES (8u << 20)
/* Steps a compile's analyses may take (the rules' nullable / productive fixpoints, the
 * left-recursion search, the dead-end pruning: each costs rules x instructions on a
 * grammar whose rules resolve one per round): past it the compile is refused with -E2BIG
 * ("too costly to analyse"), so a small but pathological grammar costs a bounded time
 * (about a second on one core) instead of hours. */
#define CST_MAX_COMPILE_WORK (1u << 26)
/* End tokens a vocabulary holds at most. */
#define CST_MAX_END_TOKENS   8

typedef struct cst_vocab cst_vocab;     /* token byte strings as a trie, and the end tokens */
typedef struct cst_grammar cst_grammar; /* a compiled constraint, immutable */
typedef struct cst_matcher cst_matcher; /* one sequence's position in a grammar */

/* ---- vocabulary --------------------------------------------------------------------- */

/*
 * The vocabulary of a loaded tokenizer: each token's raw bytes (tok_decode_bytes after a
 * non-BOS token), control tokens and tokens with no bytes never allowed, EOS and EOT the
 * end tokens. Errors: -ENOMEM.
 */
int cst_vocab_from_tokenizer(const tok_tokenizer *t, cst_vocab **out);
/*
 * The same with the caller's end tokens instead of EOS and EOT (a server's stop tokens),
 * over the tokenizer's first n_tokens tokens (all of them if it has fewer): an end token is
 * never text, and one outside those tokens is left out. Errors: -EINVAL (n_tokens < 0, or
 * n_end outside 0..CST_MAX_END_TOKENS), -ENOMEM.
 */
int cst_vocab_from_tokenizer_ends(const tok_tokenizer *t, int n_tokens, const int32_t *end_tokens,
                                  int n_end, cst_vocab **out);
/*
 * A vocabulary from explicit byte strings (tests, tools): token i is bytes[i] of lens[i]
 * bytes (a token of length 0 is never allowed); end_tokens lists the ids that end a
 * sequence. Errors: -EINVAL (an end token out of range, more than CST_MAX_END_TOKENS),
 * -ENOMEM.
 */
int cst_vocab_from_bytes(const uint8_t *const *bytes, const uint32_t *lens, int n_tokens,
                         const int32_t *end_tokens, int n_end, cst_vocab **out);
void cst_vocab_free(cst_vocab *v);
int cst_vocab_size(const cst_vocab *v);
/* Words in a mask: (vocab size + 31) / 32. */
size_t cst_mask_words(const cst_vocab *v);
/* The bytes of a token (NULL and *len 0 for an id out of range). */
const uint8_t *cst_vocab_token(const cst_vocab *v, int32_t id, uint32_t *len);

/* ---- compile ------------------------------------------------------------------------ */

/*
 * JSON Schema (draft 4 to 2020-12) text. Supported: type, properties, required,
 * additionalProperties, unevaluatedProperties (as additionalProperties), patternProperties
 * (at most 16 patterns; a key takes every matching pattern's schema), items,
 * prefixItems, additionalItems, enum, const, anyOf, oneOf (when its alternatives provably
 * cannot overlap), allOf (merged), $ref / $defs / definitions (local pointers, recursion),
 * minLength / maxLength, minItems / maxItems, minimum / maximum / exclusiveMinimum /
 * exclusiveMaximum, pattern, format (date-time, date, time, uuid, email, ipv4, hostname,
 * uri), not (of types, and of required properties) and the annotations. Anything else
 * that constrains an instance is -EINVAL naming the keyword and its JSON pointer.
 * Whitespace between JSON tokens is free ([ \t\n\r]*).
 * Errors: -EINVAL (not JSON, not a schema, unsupported, empty language, $ref cycle with
 * no base case), -E2BIG (too large), -ENOMEM. err (may be NULL) gets the detail.
 */
int cst_compile_json_schema(const char *schema, size_t len, cst_grammar **out, char *err,
                            size_t errlen);
/* Any JSON value (object_only: any JSON object), free whitespace inside. */
int cst_compile_json_value(bool object_only, cst_grammar **out, char *err, size_t errlen);
/*
 * Tool calls as a Python list of keyword calls (vLLM's pythonic syntax): spec is
 * {"tools": [{"name": N, "parameters": SCHEMA}, ...], "max_calls": K}; the text is
 * [N(k=v, ...), ...] with 1 to K calls (K 0: no bound), each of one of the tools (names
 * Python identifiers), its keyword arguments the properties of its parameters schema (one
 * object schema; only the named properties, in the schema's order, the required ones
 * present) and each value a Python literal — JSON's syntax with None, True, False — that
 * validates against its property's schema, exactly as cst_compile_json_schema enforces it.
 * Errors as cst_compile_json_schema.
 */
int cst_compile_python_calls(const char *spec, size_t len, cst_grammar **out, char *err,
                             size_t errlen);
/*
 * A regular expression that the whole output must match (as vLLM's guided_regex):
 * literals, escapes, ., classes with ranges and negation, \d \w \s \D \W \S, groups
 * (capturing, (?:), named), |, * + ? {n} {n,} {n,m} (lazy forms too); ^ and $ only at the
 * ends. Back-references, look-around, \b, \p{..} and inline flags are -EINVAL.
 */
int cst_compile_regex(const char *re, size_t len, cst_grammar **out, char *err, size_t errlen);
/*
 * A GBNF grammar (llama.cpp's format): rules `name ::= ...` with `|`, sequences, `( )`,
 * string literals and character classes (`[a-z]`, `[^...]`) over code points with the
 * escapes \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \] \-, `.`, `* + ? {m} {m,} {m,n}`, `#`
 * comments; newlines as llama.cpp reads them; the start is the rule `root`. Recursion is
 * exact. Refused (-EINVAL, with the line and the rule): syntax errors, an undefined rule, no
 * `root`, left recursion (as llama.cpp refuses it), token references `<...>`, a rule
 * defined twice, a root that matches no finite text. -E2BIG: source or program too large.
 */
int cst_compile_gbnf(const char *src, size_t len, cst_grammar **out, char *err, size_t errlen);
/* One of n strings exactly. Errors: -EINVAL (n == 0). */
int cst_compile_choice(const char *const *choices, const size_t *lens, int n, cst_grammar **out,
                       char *err, size_t errlen);
void cst_grammar_free(cst_grammar *g);
/* Instructions in the compiled program (a size figure for logs and caches). */
size_t cst_grammar_size(const cst_grammar *g);

/* ---- match -------------------------------------------------------------------------- */

/*
 * A matcher at the start of g over v (both must outlive it). Errors: -ENOMEM, -E2BIG (a
 * state's closure is over the engine's bound of threads: nested nullable repeats reached
 * through rules; the same error can come from mask, accept and feed: the sequence's
 * constraint has failed).
 */
int cst_matcher_create(const cst_grammar *g, const cst_vocab *v, cst_matcher **out);
void cst_matcher_free(cst_matcher *m);
/* Back to the start (keeps what the matcher has learnt about g: its DFA and masks). */
void cst_matcher_reset(cst_matcher *m);
/*
 * The allowed next tokens: bit t of mask[t / 32] for token t; cst_mask_words(v) words.
 * An end token's bit is set where the grammar can end here. After an end token was
 * accepted, or where the grammar allows nothing more, only the end tokens (or nothing).
 * Errors: -ENOMEM, -E2BIG (the mask is all zero then).
 */
int cst_matcher_mask(cst_matcher *m, uint32_t *mask);
/*
 * Advances by one token. Errors: -EINVAL (the token is not allowed here; the matcher is
 * unchanged), -ENOMEM, -E2BIG. An end token is accepted where the grammar can end, and
 * ends it.
 */
int cst_matcher_accept(cst_matcher *m, int32_t token);
/* Advances by raw bytes (all or nothing). Errors: -EINVAL (refused), -ENOMEM, -E2BIG. */
int cst_matcher_feed(cst_matcher *m, const void *bytes, size_t len);
/* Whether the text so far is a complete match. */
bool cst_matcher_can_end(const cst_matcher *m);
/* Whether an end token was accepted. */
bool cst_matcher_ended(const cst_matcher *m);
/* Whether nothing but the end may follow (the grammar is complete and cannot grow). */
bool cst_matcher_is_dead_end(cst_matcher *m);
/*
 * The bytes the grammar forces next: from the current state, while exactly one byte can
 * follow and the text so far is not a complete match, that byte (at most cap of them; 0 at
 * a choice, an end or after an end). A decoder may emit their tokens without computing
 * logits for them ("jump-forward"). Errors: -ENOMEM, -E2BIG.
 */
long cst_matcher_forced(cst_matcher *m, uint8_t *out, size_t cap);
/*
 * A one-line account of the current state and of the last mask (benchmarks, logs): the
 * state's id and threads, its deepest stack, its character chain, and whether the last
 * mask came from the cache, walked the vocabulary, was split (a run of plain characters),
 * parted (such a run beside narrow threads) or classed (a class of ASCII bytes under a
 * repeat) (nodes visited, DFA steps, new states made).
 */
void cst_matcher_describe(const cst_matcher *m, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
