/* SHA-256 (FIPS 180-4), small and dependency-free: the bundle reader checks every file against the
 * manifest's sha256 with it. */
#ifndef EDGE_SHA256_H
#define EDGE_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
  uint32_t state[8];
  uint64_t length; /* bytes hashed so far */
  uint8_t block[64];
  size_t filled; /* bytes waiting in block */
};

void sha256_init(struct sha256 *hash);
void sha256_update(struct sha256 *hash, const void *data, size_t size);
void sha256_final(struct sha256 *hash, uint8_t digest[32]);
/* digest as 64 lowercase hex characters plus NUL. */
void sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
