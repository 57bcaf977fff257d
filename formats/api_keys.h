/* SPDX-License-Identifier: MIT */
/*
 * formats/api_keys.h — the API keys file of ringlm-gateway: who a request is.
 *
 * One key per line:   KEY  TENANT  [CLASS]
 * separated by spaces or tabs; '#' starts a comment; blank lines are skipped. TENANT is a
 * tenant name of the daemon's policy (the gateway tags each request with it, which the
 * daemon honours because the gateway's uid is in its [trust] list); CLASS, when given, is
 * the class of requests that name none. Keys are at least 8 bytes; names are < 16 bytes
 * (the wire's limit). A duplicate key, a missing tenant or an over-long name is an error
 * with the line number.
 */
#ifndef RINGLM_FORMATS_API_KEYS_H
#define RINGLM_FORMATS_API_KEYS_H

#include <stddef.h>

#define GW_NAME_MAX 16 /* tenant and class names, with the NUL (RINGLM_WIRE_NAME_LEN) */

typedef struct gw_key {
    char *key;
    char tenant[GW_NAME_MAX];
    char class_name[GW_NAME_MAX]; /* "" = the daemon's default class */
} gw_key;

typedef struct gw_keys {
    gw_key *v;
    size_t n;
} gw_keys;

/* Parses a keys file. Returns 0, or -errno with why (line and reason) filled. */
int gw_keys_load(const char *path, gw_keys *out, char *why, size_t why_len);
/* The same from text (tests). */
int gw_keys_parse(const char *text, gw_keys *out, char *why, size_t why_len);
/* The entry of key (n bytes), or NULL. Compares every key in full, whatever matches
 * first, so the time taken does not tell how much of a guess was right. */
const gw_key *gw_keys_find(const gw_keys *k, const char *key, size_t n);
void gw_keys_free(gw_keys *k);

#endif
