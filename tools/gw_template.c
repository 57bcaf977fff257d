/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_template.c — the built-in chat templates (see gw_template.h for the shapes).
 */
#include "tools/gw_template.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const struct {
	const char *name;
	gw_template t;
} names[] = {
	{"plain", GW_TPL_PLAIN},   {"chatml", GW_TPL_CHATML},   {"llama2", GW_TPL_LLAMA2},
	{"llama-2", GW_TPL_LLAMA2}, {"llama3", GW_TPL_LLAMA3},  {"llama-3", GW_TPL_LLAMA3},
	{"mistral", GW_TPL_MISTRAL},
};

int gw_template_by_name(const char *name)
{
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		if (!strcmp(names[i].name, name))
			return (int)names[i].t;
	return -1;
}

const char *gw_template_name(gw_template t)
{
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		if (names[i].t == t)
			return names[i].name;
	return "?";
}

const char *gw_template_names(void)
{
	return "chatml, llama2, llama3, mistral, plain";
}

static bool has(const char *text, size_t len, const char *needle)
{
	return memmem(text, len, needle, strlen(needle)) != NULL;
}

int gw_template_detect(const char *text, size_t len)
{
	/* The markers each family's Jinja template spells out; a template that mixes families
	 * or spells none of them is unknown. */
	bool chatml = has(text, len, "<|im_start|>") && has(text, len, "<|im_end|>");
	bool llama3 = has(text, len, "<|start_header_id|>") && has(text, len, "<|eot_id|>");
	bool inst = has(text, len, "[INST]") && has(text, len, "[/INST]");
	if (chatml + llama3 + inst != 1)
		return -1;
	if (chatml)
		return GW_TPL_CHATML;
	if (llama3)
		return GW_TPL_LLAMA3;
	return has(text, len, "<<SYS>>") ? GW_TPL_LLAMA2 : GW_TPL_MISTRAL;
}

static int add(gw_buf *b, const char *s)
{
	return gw_buf_adds(b, s);
}

/* [INST]-style templates: an optional system message, then user/assistant alternating,
 * ending on the user's turn. */
static int inst_like(gw_template t, const gw_message *m, int n, gw_buf *o, const char **why)
{
	const char *sys = NULL;
	int i = 0;
	if (n > 0 && !strcmp(m[0].role, "system")) {
		sys = m[0].content;
		i = 1;
	}
	if (i >= n) {
		*why = "messages need at least one user message";
		return -EINVAL;
	}
	int r = 0;
	for (int k = 0; i < n; i++, k++) {
		const char *want = k % 2 == 0 ? "user" : "assistant";
		if (strcmp(m[i].role, want)) {
			*why = t == GW_TPL_LLAMA2
				? "the llama2 template needs user and assistant messages to alternate (after one optional system message)"
				: "the mistral template needs user and assistant messages to alternate (after one optional system message)";
			return -EINVAL;
		}
		if (k % 2 == 0) {
			r |= add(o, k == 0 ? "[INST] " : t == GW_TPL_LLAMA2 ? "<s>[INST] " : "[INST] ");
			if (k == 0 && sys) {
				if (t == GW_TPL_LLAMA2) {
					r |= add(o, "<<SYS>>\n");
					r |= add(o, sys);
					r |= add(o, "\n<</SYS>>\n\n");
				} else {
					r |= add(o, sys);
					r |= add(o, "\n\n");
				}
			}
			r |= add(o, m[i].content);
			r |= add(o, " [/INST]");
		} else {
			r |= add(o, t == GW_TPL_LLAMA2 ? " " : "");
			r |= add(o, m[i].content);
			r |= add(o, t == GW_TPL_LLAMA2 ? " </s>" : "</s>");
		}
	}
	if (strcmp(m[n - 1].role, "user")) {
		*why = "the last message must be the user's";
		return -EINVAL;
	}
	return r ? -ENOMEM : 0;
}

int gw_template_render(gw_template t, const gw_message *m, int n, gw_buf *o, const char **why)
{
	int r = 0;
	*why = NULL;
	if (n < 1) {
		*why = "messages is empty";
		return -EINVAL;
	}
	switch (t) {
	case GW_TPL_PLAIN:
		for (int i = 0; i < n; i++) {
			if (i)
				r |= add(o, "\n");
			r |= add(o, m[i].content);
		}
		break;
	case GW_TPL_CHATML:
		for (int i = 0; i < n; i++) {
			r |= add(o, "<|im_start|>");
			r |= add(o, m[i].role);
			r |= add(o, "\n");
			r |= add(o, m[i].content);
			r |= add(o, "<|im_end|>\n");
		}
		r |= add(o, "<|im_start|>assistant\n");
		break;
	case GW_TPL_LLAMA3:
		for (int i = 0; i < n; i++) {
			r |= add(o, "<|start_header_id|>");
			r |= add(o, m[i].role);
			r |= add(o, "<|end_header_id|>\n\n");
			r |= add(o, m[i].content);
			r |= add(o, "<|eot_id|>");
		}
		r |= add(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case GW_TPL_LLAMA2:
	case GW_TPL_MISTRAL:
		return inst_like(t, m, n, o, why);
	default:
		*why = "unknown template";
		return -EINVAL;
	}
	return r ? -ENOMEM : 0;
}
