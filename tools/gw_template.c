/* SPDX-License-Identifier: MIT */
/*
 * tools/gw_template.c — the gateway's names for the chat templates of the client library
 * (ringlm_chat_format in libclient/chat.c, where any client can use them).
 */
#include "tools/gw_template.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ringlm.h"

_Static_assert((int)GW_TPL_PLAIN == (int)RINGLM_CHAT_PLAIN &&
		       (int)GW_TPL_CHATML == (int)RINGLM_CHAT_CHATML &&
		       (int)GW_TPL_LLAMA2 == (int)RINGLM_CHAT_LLAMA2 &&
		       (int)GW_TPL_LLAMA3 == (int)RINGLM_CHAT_LLAMA3 &&
		       (int)GW_TPL_MISTRAL == (int)RINGLM_CHAT_MISTRAL,
	       "gw_template numbers the library's templates");

int gw_template_by_name(const char *name)
{
	int t = ringlm_chat_template_by_name(name);
	return t < 0 ? -1 : t;
}

const char *gw_template_name(gw_template t)
{
	return ringlm_chat_template_name((int)t);
}

const char *gw_template_names(void)
{
	return ringlm_chat_template_names();
}

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
