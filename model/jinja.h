/* SPDX-License-Identifier: MIT */
/*
 * model/jinja.h — a small Jinja interpreter for chat templates (tokenizer.chat_template).
 *
 * It renders a template the way @huggingface/jinja (the renderer transformers.js uses, and
 * ringlm's oracle in tests/test_jinja_oracle.c) renders it, byte for byte, including where
 * that renderer differs from Python's Jinja: trim_blocks and lstrip_blocks are on (as
 * transformers sets them), booleans print as "true"/"false", str.strip()/lstrip()/rstrip()
 * ignore their argument and trim JavaScript whitespace, numbers print as JavaScript prints
 * them (an integral float as "2.0"), a missing attribute or variable is undefined and prints
 * nothing, `==` is JavaScript's loose equality. What chat templates use is covered:
 * if/elif/else, for (with `loop.*`, `else`, an `if` filter, break/continue), set (also
 * block set and namespace attributes), macro/call, filter blocks, namespace(), range(),
 * raise_exception(), strftime_now(), the filters (tojson, trim, length, upper/lower, items,
 * join, replace, default, first/last, sort, unique, map, selectattr/rejectattr, indent,
 * int/float/string, dictsort ...), string methods (startswith, endswith, strip, split,
 * title, replace ...), tests (defined, none, string, number, mapping, iterable ...),
 * slicing, `in`, `~`, list and dict literals. Where the two renderers differ outside what
 * the oracle checks (Unicode case mapping, locale order in tojson(sort_keys=true)), this
 * one stays with ASCII and byte order.
 *
 * No Debian package offers a C Jinja implementation (checked: apt-cache search jinja lists
 * Python's jinja2, its plugins and R's jinjar only), hence this one.
 *
 * Rendering is bounded: steps (every node evaluated counts; loops end there), nesting of
 * evaluation (macro recursion), the bytes of every string produced, and the memory a
 * render may allocate. A template past a bound, or one that raises, renders nothing and
 * says why.
 *
 * Errors: functions return 0 or a negative errno with jinja_errmsg() set (thread-local).
 * A template is immutable once parsed: several threads may render it at once.
 */
#ifndef RINGLM_MODEL_JINJA_H
#define RINGLM_MODEL_JINJA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson */

typedef struct jinja_template jinja_template;

/* Bounds of one render; a zero field takes its default. */
typedef struct jinja_limits {
    size_t max_output_bytes; /* any string produced, the output included (16 MiB) */
    size_t max_memory_bytes; /* everything a render allocates (128 MiB) */
    uint64_t max_steps;      /* nodes evaluated, loop iterations included (5,000,000) */
    int max_depth;           /* nesting of evaluation, macro calls included (400) */
} jinja_limits;

/*
 * Parses len bytes of template source. Returns 0 and *out (free with jinja_free), -EINVAL
 * when the template does not parse (the detail names the line and what was expected),
 * -E2BIG when it nests deeper than the parser allows (200 levels), -ENOMEM.
 */
int jinja_parse(const char *src, size_t len, jinja_template **out);

/*
 * Renders t with the members of the JSON object vars as its variables (messages, tools,
 * bos_token, add_generation_prompt, ...; NULL: none) into *text (NUL-terminated, malloc()ed,
 * *len bytes; free() it). Returns 0; -EINVAL when the template fails (raise_exception: the
 * detail is "raise_exception: MESSAGE"; otherwise what went wrong, with its line); -E2BIG
 * past a bound of lim (NULL: the defaults); -ENOMEM.
 */
int jinja_render(const jinja_template *t, const struct json_t *vars, const jinja_limits *lim,
                 char **text, size_t *len);

void jinja_free(jinja_template *t);

/* The detail of the last error on this thread ("" when none). */
const char *jinja_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
