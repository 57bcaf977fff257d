/* SPDX-License-Identifier: MIT */
/*
 * libclient/client_internal.h — what the client library's files share and ringlm.h does not
 * show: the setter of ringlm_errdetail()'s detail. Not exported (libringlm.map).
 */
#ifndef RINGLM_LIBCLIENT_CLIENT_INTERNAL_H
#define RINGLM_LIBCLIENT_CLIENT_INTERNAL_H

/* Sets ringlm_errdetail() (printf style; an argument may be the detail itself); returns err. */
int client_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
