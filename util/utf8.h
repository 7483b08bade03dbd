/* UTF-8 validation, for text that ends up in JSON: jansson refuses strings
 * that are not UTF-8, so whatever a client sends (path, headers) is
 * sanitised before it is echoed back, and files whose text is served
 * (labels) are checked when they load. */
#ifndef RESNETD_UTF8_H
#define RESNETD_UTF8_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s[0..n) (1 to 4), or 0 if s does
 * not start one (overlong forms, surrogates and code points past U+10FFFF
 * are invalid, as RFC 3629 says). n must be at least 1. */
size_t utf8_sequence(const unsigned char *s, size_t n);

/* Offset of the first byte of s[0..n) that is not valid UTF-8, or n. */
size_t utf8_invalid_at(const char *s, size_t n);

/* Copies the NUL-terminated src into dst (cap >= 1, always terminated),
 * writing each byte that is not valid UTF-8 as the text \xNN, and never
 * cutting a character in two when dst is too small. Returns dst. */
char *utf8_sanitize(char *dst, size_t cap, const char *src);

#endif
