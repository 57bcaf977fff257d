/* SPDX-License-Identifier: MIT */
/*
 * model/chat.h — chat templates: a conversation to the prompt text a model of that family
 * was trained on, ending where the assistant's turn begins. A model file's own
 * tokenizer.chat_template is rendered as Jinja (chat_jinja_*, at the end, through
 * model/jinja.h); the built-in formatters below are for files without one (and can be
 * matched to a file's template by the markers it spells):
 *
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n   (Qwen)
 *   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] USER [/INST]
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ... assistant header
 *   mistral  [INST] SYSTEM\n\nUSER [/INST]ANSWER</s>[INST] USER [/INST]   (and v1, v3,
 *            v3-tekken, v7: see enum chat_template)
 *   plain    the contents joined by "\n" (models that know no roles)
 *
 * The client library exports these as ringlm_chat_* (libclient/ringlm.h, the manual for
 * clients: same values, same shapes); this is the model-level API that the library, the
 * engine and the tools share.
 *
 * Errors: functions return a template (>= 0) or 0, or a negative errno with chat_errmsg()
 * set (thread-local). Thread safety: no state besides that detail.
 */
#ifndef RINGLM_MODEL_CHAT_H
#define RINGLM_MODEL_CHAT_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct chat_msg {
    const char *role; /* "system", "user", "assistant" (others are written as named) */
    const char *content;
} chat_msg;

enum chat_template {
    CHAT_PLAIN = 0,
    CHAT_CHATML = 1,
    CHAT_LLAMA2 = 2,
    CHAT_LLAMA3 = 3,
    CHAT_MISTRAL = 4,           /* Mistral 7B Instruct v0.1/v0.2's first template */
    CHAT_MISTRAL_V1 = 5,        /* Mistral's "v1" (" [INST] ", the system message first) */
    CHAT_MISTRAL_V3 = 6,        /* "v3" (Mistral 7B v0.3, Large 2407: "[INST] x[/INST]") */
    CHAT_MISTRAL_V3_TEKKEN = 7, /* "v3-tekken" (Mistral Nemo: "[INST]x[/INST]") */
    CHAT_MISTRAL_V7 = 8,        /* "v7" (Mistral Large 2411: "[SYSTEM_PROMPT] x[/SYSTEM_PROMPT]") */
};

/* Template by name ("chatml", "llama2"/"llama-2", "llama3"/"llama-3", "mistral",
 * "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "plain"); -EINVAL when
 * unknown or NULL. */
int chat_template_by_name(const char *name);
/* Its name ("?" when not a template); the names accepted ("chatml, llama2, ..."). */
const char *chat_template_name(int tpl);
const char *chat_template_names(void);
/* The built-in template a Jinja chat template is (by the markers it spells); -ENOTSUP when
 * it is none of them or spells several (the detail quotes its start), -EINVAL when NULL. */
int chat_template_match(const char *jinja);
/* The same for a GGUF model file's tokenizer.chat_template: -ENOENT when the file has none,
 * -ENOTSUP when it is not a built-in one, -EINVAL/-ENOENT/-EACCES when the file is unreadable
 * or not GGUF (the detail says which), -ENOMEM. */
int chat_template_of_model(const char *gguf_path);
/*
 * Renders n messages with template tpl into *text (NUL-terminated, malloc()ed: free() it;
 * NULL on error). Returns 0, -EINVAL (no messages, a NULL role or content, an unknown
 * template, a role the template cannot place — llama2/mistral need user and assistant to
 * alternate after an optional system message and end on the user's), or -ENOMEM.
 */
int chat_format(int tpl, const chat_msg *msgs, int n, char **text);

/* ---- the model file's own template (Jinja, model/jinja.h) ------------------------------ */

typedef struct chat_jinja chat_jinja;

/* Render flags. CHAT_JINJA_STRIP_BOS: the text does not start with the BOS token's text (for a
 * caller whose tokenizer adds the BOS id itself); CHAT_JINJA_STRIP_EOS: nor ends with the EOS
 * token's text (a tokenizer that adds the EOS id). llama.cpp's chat templates strip them so
 * where its vocabulary adds them (add_bos_token, add_eos_token). */
#define CHAT_JINJA_STRIP_BOS 1u
#define CHAT_JINJA_STRIP_EOS 2u

/* Parses gguf_path's tokenizer.chat_template, with the texts of its BOS and EOS tokens (the
 * template's bos_token and eos_token). Returns 0, -ENOENT when the file has no template,
 * -EINVAL when it does not parse (the detail names the file and the template's line) or the
 * file is not GGUF, -EACCES, -E2BIG, -ENOMEM. */
int chat_jinja_load(const char *gguf_path, chat_jinja **out);
/* The same from a template's text (bos, eos: the token texts; NULL is ""). */
int chat_jinja_new(const char *source, const char *bos, const char *eos, chat_jinja **out);
/*
 * Renders the template with the members of vars_json (a JSON object: messages, tools,
 * add_generation_prompt, enable_thinking, ...) as its variables; bos_token, eos_token and
 * add_generation_prompt (true) are added where vars_json lacks them. *text is malloc()ed.
 * Returns 0, -EINVAL (vars_json is not a JSON object; the template raised or failed: the
 * detail says what, "raise_exception: MESSAGE" for the template's own refusal), -E2BIG (the
 * template loops, recurses or grows past the interpreter's bounds), -ENOMEM.
 */
int chat_jinja_render(const chat_jinja *t, const char *vars_json, unsigned flags, char **text);
void chat_jinja_free(chat_jinja *t);

/* The detail of the last error on this thread ("" when none). */
const char *chat_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
