/* SPDX-License-Identifier: MIT */
/* kernels/sha256.h — a small SHA-256 (FIPS 180-4) for model identities. */
#ifndef RINGLM_KERNELS_SHA256_H
#define RINGLM_KERNELS_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t used;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t digest[32]);
/* digest of buf as 64 lowercase hex characters + NUL */
void sha256_hex(const void *buf, size_t len, char hex[65]);

#endif
