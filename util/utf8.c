/* UTF-8 validation (RFC 3629) and sanitising for echoed client text. */
#include <stdio.h>
#include <string.h>
#include "util/utf8.h"

size_t utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        else if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

size_t utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_sequence(u + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

char *utf8_sanitize(char *dst, size_t cap, const char *src)
{
    const unsigned char *u = (const unsigned char *)src;
    size_t n = strlen(src), i = 0, o = 0;
    while (i < n) {
        size_t k = utf8_sequence(u + i, n - i);
        if (k > 0) {
            if (o + k >= cap)
                break;
            memcpy(dst + o, u + i, k);
            o += k;
            i += k;
        } else {
            if (o + 4 >= cap)
                break;
            snprintf(dst + o, cap - o, "\\x%02X", u[i]);
            o += 4;
            i++;
        }
    }
    dst[o] = '\0';
    return dst;
}
