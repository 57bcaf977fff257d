/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_template.h — built-in chat templates (no Jinja engine): a list of messages to the
 * prompt text a model of that family was trained on, ending where the assistant's turn
 * begins.
 *
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] USER [/INST]
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ... assistant header
 *   mistral  [INST] SYSTEM\n\nUSER [/INST]ANSWER</s>[INST] USER [/INST]
 *   plain    the contents joined by "\n" (the tiny story models know no roles)
 *
 * The beginning-of-sequence token is not in the text: the tokenizer adds it (BOS first), as
 * every template above starts with bos_token. Tokens between turns that the model's
 * templates spell ("</s><s>", "<|eot_id|>") are written as their text; a tokenizer that
 * knows special tokens maps them.
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
