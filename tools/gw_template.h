/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_template.h — the gateway's handle on the built-in chat templates, which live in
 * the client library (ringlm.h: ringlm_chat_format, the shapes, trimming and BOS rules) so
 * that any client formats a conversation the model's way; the numbers are the library's.
 */
#ifndef RINGLM_TOOLS_GW_TEMPLATE_H
#define RINGLM_TOOLS_GW_TEMPLATE_H

#include <stddef.h>

#include "tools/gw_text.h"

typedef enum gw_template {
	GW_TPL_PLAIN = 0,
	GW_TPL_CHATML,
	GW_TPL_LLAMA2,
	GW_TPL_LLAMA3,
	GW_TPL_MISTRAL,
} gw_template;

typedef struct gw_message {
	const char *role;     /* "system", "user", "assistant" (others are kept as named) */
	const char *content;
} gw_message;

/* Template by name ("chatml", "llama2"/"llama-2", "llama3"/"llama-3", "mistral", "plain");
 * -1 when unknown. */
int gw_template_by_name(const char *name);
const char *gw_template_name(gw_template t);
/* The names accepted, for messages: "chatml, llama2, llama3, mistral, plain". */
const char *gw_template_names(void);

/* The built-in template whose family a model file's Jinja chat template is (GGUF's
 * tokenizer.chat_template), by the markers it spells: <|im_start|>/<|im_end|> → chatml,
 * <|start_header_id|>/<|eot_id|> → llama3, [INST]/[/INST] with <<SYS>> → llama2, without →
 * mistral. -1 when it is none of them, or more than one: the caller must not guess. */
int gw_template_detect(const char *text, size_t len);

/*
 * Renders messages into out (appended). Returns 0, -EINVAL with *why set (a role the
 * template cannot place: llama2/mistral need user and assistant to alternate after an
 * optional system message, and the last message must be the user's), or -ENOMEM.
 */
int gw_template_render(gw_template t, const gw_message *m, int n, gw_buf *out,
		       const char **why);

#endif
