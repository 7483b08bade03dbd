/* SHA-256 (FIPS 180-4), small and dependency-free: the daemon reports the
 * digest of its weights file so a client can tell which model answered. */
#ifndef RESNETD_SHA256_H
#define RESNETD_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
    uint32_t h[8]; /* chaining state */
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64]; /* partial block */
    size_t nbuf; /* bytes in buf */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t digest[32]);

/* One-shot digest of data as 64 lower-case hex digits plus a NUL. */
void sha256_hex(const void *data, size_t len, char hex[65]);

#endif
