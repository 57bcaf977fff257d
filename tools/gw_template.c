/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_template.c — the built-in chat templates (see gw_template.h for the shapes).
 */
#include "tools/gw_template.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ringlm.h"

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

int gw_template_detect(const char *text, size_t len)
{
	/* the client library's matching (ringlm_chat_template_match: the markers each family's
	 * Jinja template spells; a mixture or none is unknown) */
	char *copy = strndup(text, len);
	int t = copy ? ringlm_chat_template_match(copy) : -1;
	free(copy);
	return t < 0 ? -1 : t;
}

/* The formatting lives in the client library (libclient/chat.c), where any client can use
 * it; the numbers of gw_template are the library's. */
_Static_assert((int)GW_TPL_PLAIN == (int)RINGLM_CHAT_PLAIN &&
		       (int)GW_TPL_CHATML == (int)RINGLM_CHAT_CHATML &&
		       (int)GW_TPL_LLAMA2 == (int)RINGLM_CHAT_LLAMA2 &&
		       (int)GW_TPL_LLAMA3 == (int)RINGLM_CHAT_LLAMA3 &&
		       (int)GW_TPL_MISTRAL == (int)RINGLM_CHAT_MISTRAL,
	       "gw_template numbers the library's templates");

int gw_template_render(gw_template t, const gw_message *m, int n, gw_buf *o, const char **why)
{
	*why = NULL;
	ringlm_chat_msg *msgs = calloc(n > 0 ? (size_t)n : 1, sizeof *msgs);
	if (!msgs)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		msgs[i] = (ringlm_chat_msg){m[i].role, m[i].content};
	char *text = NULL;
	int r = ringlm_chat_format((int)t, msgs, n, &text);
	free(msgs);
	if (r == -EINVAL)
		*why = ringlm_errdetail(); /* thread-local: valid until this thread's next failure */
	if (r == 0 && gw_buf_adds(o, text))
		r = -ENOMEM;
	free(text);
	return r;
}
