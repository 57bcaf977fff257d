/* SPDX-License-Identifier: MIT */
/*
 * constrain/prog.h — the program the constraint compilers emit and matchers run (internal
 * to constrain/).
 *
 * Programs are built backwards, continuation first: every emitter takes the pc to go to
 * after the construct has matched (`next`) and returns the construct's entry pc, so a
 * sequence a b is emit(a, emit(b, next)) and no patch lists exist. Loops and subroutines
 * allocate their entry instruction first and patch its target once the body is emitted.
 *
 *   SET  set, next   consume one byte in byte set `set`, go to next
 *   SPLIT a, b       go to both
 *   JMP  a
 *   CALL a, ret      push ret, go to a (a subroutine, which ends in RET)
 *   RET              pop, go there
 *   MATCH            the end of the grammar (meaningful with an empty stack)
 *   FAIL             matches nothing (pc 0: what a failed emitter returns)
 *
 * Errors: the first error is kept in the program (failed, err) and every later emitter
 * returns pc 0, so a compiler checks once at the end.
 */
#ifndef RINGLM_CONSTRAIN_PROG_H
#define RINGLM_CONSTRAIN_PROG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/cst.h"

enum { OP_FAIL = 0, OP_SET, OP_SPLIT, OP_JMP, OP_CALL, OP_RET, OP_MATCH };

typedef struct cst_inst {
    uint32_t op;
    uint32_t a, b; /* SET: a = byte set, b = next; SPLIT a b; JMP a; CALL a = entry, b = ret */
} cst_inst;

typedef struct cst_byteset {
    uint64_t w[4];
} cst_byteset;

typedef struct cst_prog {
    cst_inst *insts;
    uint32_t n, cap;
    cst_byteset *sets;
    uint32_t nsets, setcap;
    uint32_t *set_hash; /* open addressing over sets, for dedup */
    uint32_t set_hash_cap;
    uint32_t start;
    uint32_t max_insts;
    int failed; /* 0, or the negative errno of the first error */
    char err[512];
} cst_prog;

int prog_init(cst_prog *p);
void prog_release(cst_prog *p);
/* Records the first error (-EINVAL, -E2BIG, -ENOMEM) with a printf detail; returns 0. */
uint32_t prog_fail(cst_prog *p, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

uint32_t prog_emit(cst_prog *p, uint32_t op, uint32_t a, uint32_t b);
uint32_t prog_set(cst_prog *p, const cst_byteset *s, uint32_t next);
uint32_t prog_range(cst_prog *p, uint8_t lo, uint8_t hi, uint32_t next);
uint32_t prog_lit(cst_prog *p, const void *bytes, size_t n, uint32_t next);
uint32_t prog_split(cst_prog *p, uint32_t a, uint32_t b);
/* Sets the first target of instruction pc (a loop's or a subroutine's entry, emitted before
 * its body). A function, so that `target` is computed before p->insts is read: emitting it
 * may move the array. No-op after an error. */
void prog_patch(cst_prog *p, uint32_t pc, uint32_t target);
/* One of n entries (n >= 1): a chain of splits. */
uint32_t prog_alts(cst_prog *p, const uint32_t *entries, size_t n);
/* [ \t\n\r]* then next. */
uint32_t prog_ws(cst_prog *p, uint32_t next);

/* ---- code point sets (sorted disjoint inclusive ranges) -------------------------------- */
typedef struct cps_range {
    uint32_t lo, hi;
} cps_range;
typedef struct cst_cps {
    cps_range *r;
    size_t n, cap;
} cst_cps;

#define CST_MAX_CP 0x10FFFFu
void cps_free(cst_cps *s);
int cps_add(cst_cps *s, uint32_t lo, uint32_t hi); /* then normalised on use */
void cps_normalize(cst_cps *s);
int cps_negate(cst_cps *s); /* within [0, 0x10FFFF] */
int cps_subtract(cst_cps *s, uint32_t lo, uint32_t hi);
bool cps_empty(cst_cps *s);

/*
 * Emits "one code point of s" in UTF-8 (surrogates never). json_string: as the content of
 * a JSON string in the one form json.dumps(ensure_ascii=False) writes: " \ and controls
 * escaped (\" \\ \b \f \n \r \t, else \u00xx), everything else raw.
 */
uint32_t prog_cps(cst_prog *p, cst_cps *s, bool json_string, uint32_t next);
/* A code point c as json_string (or raw UTF-8) bytes; returns the byte count (<= 6). */
size_t cst_encode_cp(uint32_t c, bool json_string, uint8_t *out);
/* Appends the json.dumps(ensure_ascii=False) form of a UTF-8 string, quotes included, to a
 * growing buffer. Returns 0 or -EINVAL (not UTF-8) / -ENOMEM. */
int cst_json_quote(const char *s, size_t n, char **buf, size_t *len, size_t *cap);

/* Python's repr() of a finite float (what json.dumps writes). Returns 0 or -EINVAL. */
int cst_py_float_repr(double x, char *out, size_t cap);

/* ---- regular expressions (regex.c) --------------------------------------------------- */
enum {
    RE_WHOLE = 0,       /* the whole text matches (guided_regex) */
    RE_SEARCH = 1,      /* JSON Schema `pattern`: a match anywhere, unless anchored */
    RE_JSON_STRING = 2, /* the text is the content of a JSON string (escapes as json.dumps) */
};
/* Emits the regex; errors are recorded in p (what and at which offset). */
uint32_t cst_regex_emit(cst_prog *p, const char *re, size_t len, int flags, uint32_t next);

/* ---- the grammar object (cst.c) -------------------------------------------------------- */
typedef struct cst_grammar cst_grammar;
struct cst_grammar {
    cst_prog prog;
    uint8_t byte_class[256];   /* bytes in one class: no byte set of the program separates them */
    uint16_t class_start[257]; /* class c's bytes: class_bytes[class_start[c] .. [c + 1]) */
    uint8_t class_bytes[256];
    uint32_t sentinel; /* a SET of no byte that no code reaches (0: none; cst.c) */
};
/*
 * A grammar's byte-level DFA, for compilers that build automata from other automata (the
 * keys of patternProperties): a matcher with no vocabulary, its start state, a step (0: the
 * dead state; -ENOMEM, -E2BIG on error) and whether a state is a complete match. State ids
 * stay valid while only cst_dfa_step is used on the matcher.
 */
int cst_dfa_open(const cst_grammar *g, cst_matcher **out);
void cst_dfa_close(cst_matcher *m);
uint32_t cst_dfa_start(const cst_matcher *m);
int32_t cst_dfa_step(cst_matcher *m, uint32_t s, uint8_t byte);
bool cst_dfa_accepting(const cst_matcher *m, uint32_t s);
uint32_t cst_dfa_states(const cst_matcher *m);

/* Checks the program for left recursion (a subroutine that can call itself before it has
 * consumed a byte) and wraps it; takes p over. */
int cst_grammar_finish(cst_prog *p, cst_grammar **out, char *err, size_t errlen);

#endif
