/* SPDX-License-Identifier: MIT */
/*
 * libclient/chat.c — the exported chat-template API (ringlm_chat_*, ringlm.h): thin
 * wrappers over model/chat.h, which holds the templates. The public header is installed
 * alone, so it spells its own enum and message struct; they are model/'s, checked here.
 */
#include "ringlm.h"
#include "model/chat.h"
#include "client_internal.h"

#include <errno.h>
#include <stddef.h>

#define SAME(x) ((int)RINGLM_CHAT_##x == (int)CHAT_##x)
_Static_assert(SAME(PLAIN) && SAME(CHATML) && SAME(LLAMA2) && SAME(LLAMA3) && SAME(MISTRAL) &&
                   SAME(MISTRAL_V1) && SAME(MISTRAL_V3) && SAME(MISTRAL_V3_TEKKEN) &&
                   SAME(MISTRAL_V7),
               "ringlm.h's chat templates are model/chat.h's");
#undef SAME
_Static_assert(sizeof(ringlm_chat_msg) == sizeof(chat_msg) &&
                   offsetof(ringlm_chat_msg, role) == offsetof(chat_msg, role) &&
                   offsetof(ringlm_chat_msg, content) == offsetof(chat_msg, content),
               "ringlm_chat_msg is laid out as chat_msg");

/* A model/ failure becomes this library's: the same errno, its detail in ringlm_errdetail(). */
static int fail(int err)
{
    return err < 0 ? client_seterr(err, "%s", chat_errmsg()) : err;
}

int ringlm_chat_template_by_name(const char *name)
{
    return fail(chat_template_by_name(name));
}

const char *ringlm_chat_template_name(int tpl)
{
    return chat_template_name(tpl);
}

const char *ringlm_chat_template_names(void)
{
    return chat_template_names();
}

int ringlm_chat_template_match(const char *jinja)
{
    return fail(chat_template_match(jinja));
}

int ringlm_chat_template_of_model(const char *gguf_path)
{
    return fail(chat_template_of_model(gguf_path));
}

int ringlm_chat_format(int tpl, const ringlm_chat_msg *msgs, int n, char **text)
{
    return fail(chat_format(tpl, (const chat_msg *)msgs, n, text));
}

/* The opaque handle is model/'s chat_jinja under the public name. */
struct ringlm_chat_jinja;
_Static_assert(RINGLM_CHAT_JINJA_STRIP_BOS == CHAT_JINJA_STRIP_BOS &&
                   RINGLM_CHAT_JINJA_STRIP_EOS == CHAT_JINJA_STRIP_EOS &&
                   RINGLM_CHAT_JINJA_STRIP_BOS == RINGLM_TOKENIZE_BOS &&
                   RINGLM_CHAT_JINJA_STRIP_EOS == RINGLM_TOKENIZE_EOS,
               "ringlm.h's render flags are model/chat.h's and the tokenizer's");

int ringlm_chat_jinja_load(const char *gguf_path, ringlm_chat_jinja **out)
{
    return fail(chat_jinja_load(gguf_path, (chat_jinja **)out));
}

int ringlm_chat_jinja_new(const char *source, const char *bos, const char *eos,
                          ringlm_chat_jinja **out)
{
    return fail(chat_jinja_new(source, bos, eos, (chat_jinja **)out));
}

int ringlm_chat_jinja_render(const ringlm_chat_jinja *t, const char *vars_json, unsigned flags,
                             char **text)
{
    if (flags & ~(RINGLM_CHAT_JINJA_STRIP_BOS | RINGLM_CHAT_JINJA_STRIP_EOS))
        return client_seterr(-EINVAL, "ringlm_chat_jinja_render: unknown flags 0x%x", flags);
    return fail(chat_jinja_render((const chat_jinja *)t, vars_json, flags, text));
}

void ringlm_chat_jinja_free(ringlm_chat_jinja *t)
{
    chat_jinja_free((chat_jinja *)t);
}
