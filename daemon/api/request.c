/* Request state and the parsers for client input. Everything here treats
 * its input as hostile: lengths are checked before every read. */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "daemon/api/request.h"

request *request_create(void)
{
    request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return NULL;
    }
    r->fd = -1;
    r->top_k = REQUEST_DEFAULT_TOP_K;
    r->v2_header_len = -1;
    atomic_init(&r->pending, 0);
    return r;
}

void request_free(request *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    request_drop_body(r);
    free(r->topk);
    free(r);
}

int request_append(request *r, const uint8_t *data, size_t n)
{
    size_t need = r->len + n;
    if (need > r->cap) {
        size_t cap = r->cap ? r->cap : 64 * 1024;
        while (cap < need)
            cap *= 2;
        if (r->expect && need <= r->expect && cap > r->expect)
            cap = r->expect;
        if (r->max_len && need <= r->max_len && cap > r->max_len)
            cap = r->max_len; /* else a chunked body near the limit would ask the budget for twice it */
        if (r->budget && budget_try_acquire(r->budget, cap - r->cap) != 0)
            return -2;
        uint8_t *b = realloc(r->body, cap);
        if (!b) {
            if (r->budget)
                budget_release(r->budget, cap - r->cap);
            return -1;
        }
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    return 0;
}

void request_drop_body(request *r)
{
    free(r->body);
    if (r->budget)
        budget_release(r->budget, r->cap);
    r->body = NULL;
    r->len = r->cap = 0;
}

void request_fail(request *r, int status, const char *code, const char *message)
{
    pthread_mutex_lock(&r->mu);
    if (!r->fail_status) {
        r->fail_status = status;
        r->fail_code = code;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", message);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Case-insensitive: does s start with the media type t, followed by the
 * end, ';' or whitespace? */
static int media_type_is(const char *s, const char *t)
{
    size_t n = strlen(t);
    return strncasecmp(s, t, n) == 0 && (s[n] == '\0' || s[n] == ';' || isspace((unsigned char)s[n]));
}

static int is_tchar(unsigned char c)
{
    return c > 0x20 && c < 0x7F && !strchr("\"(),/:;<=>?@[\\]{}", c);
}

/* Finds parameter `name` in "type/sub; a=b; name=value" (RFC 9110:
 * parameter = token "=" ( token / quoted-string )), walking the parameters
 * in order so that a ';' or "name=" inside another one's quoted value is
 * not taken for a separator or a match. A quoted value is unquoted
 * (backslash escapes resolved). Returns 0; -1 if absent, malformed, empty
 * or longer than outlen - 1. */
static int find_param(const char *ct, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    const char *p = strchr(ct, ';');
    while (p) {
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        const char *key = p;
        while (is_tchar((unsigned char)*p))
            p++;
        if (*p != '=' || p == key)
            return -1;
        int match = (size_t)(p - key) == nl && strncasecmp(key, name, nl) == 0;
        p++;
        size_t len = 0;
        int overflow = 0;
        if (*p == '"') {
            for (p++; *p != '"'; p++) {
                if (*p == '\\' && p[1])
                    p++;
                else if (*p == '\0' || (unsigned char)*p < 0x20)
                    return -1; /* unterminated, or a control character */
                if (len + 1 < outlen)
                    out[len] = *p;
                else
                    overflow = 1;
                len++;
            }
            p++;
        } else {
            /* Leniently more than a token: anything up to ';' or white space
             * (boundaries with '/', '=' or '?' unquoted exist in the wild). */
            for (; (unsigned char)*p > 0x20 && *p != ';' && *p != '"' && *p != 0x7F; p++) {
                if (len + 1 < outlen)
                    out[len] = *p;
                else
                    overflow = 1;
                len++;
            }
        }
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p != ';' && *p != '\0')
            return -1;
        if (match) {
            if (len == 0 || overflow)
                return -1;
            out[len] = '\0';
            return 0;
        }
        p = *p ? p : NULL;
    }
    return -1;
}

int request_is_form_type(const char *ct)
{
    if (!ct)
        return 0;
    while (isspace((unsigned char)*ct))
        ct++;
    return media_type_is(ct, "application/x-www-form-urlencoded");
}

int request_parse_content_type(const char *ct, request_body_kind *kind, char *boundary, size_t blen)
{
    if (!ct)
        ct = "";
    while (isspace((unsigned char)*ct))
        ct++;
    if (!*ct || media_type_is(ct, "image/jpeg") || media_type_is(ct, "application/octet-stream") ||
        media_type_is(ct, "application/x-www-form-urlencoded")) {
        *kind = REQ_BODY_RAW;
        return 0;
    }
    if (media_type_is(ct, "multipart/form-data")) {
        *kind = REQ_BODY_MULTIPART;
        /* RFC 2046: 1..70 characters. */
        if (blen < 71 || find_param(ct, "boundary", boundary, 71) != 0)
            return -2;
        return 0;
    }
    return -1;
}

int request_parse_top_k(const char *s, int max, int *k)
{
    /* Canonical decimal only: no sign, no leading zero. */
    if (!s || !*s || s[0] == '0')
        return -1;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return -1;
        v = v * 10 + (*p - '0');
        if (v > max) /* also stops before a long digit string overflows */
            return -1;
    }
    if (v < 1)
        return -1;
    *k = (int)v;
    return 0;
}

static const uint8_t *find_bytes(const uint8_t *hay, size_t haylen, const char *needle, size_t nlen)
{
    if (haylen < nlen) /* also keeps a NULL hay (an empty body) away from memmem */
        return NULL;
    return memmem(hay, haylen, needle, nlen);
}

/* The name="..." of a Content-Disposition: form-data header line. */
static int disposition_name(const char *line, size_t len, char *name, size_t namelen)
{
    static const char key[] = "name=\"";
    for (size_t i = 0; i + sizeof key - 1 <= len; i++) {
        /* "name=" preceded by ';' or space, so "filename=" does not match. */
        if (strncasecmp(line + i, key, sizeof key - 1) == 0 && i > 0 &&
            (line[i - 1] == ';' || line[i - 1] == ' ' || line[i - 1] == '\t')) {
            const char *v = line + i + sizeof key - 1;
            const char *end = memchr(v, '"', len - (size_t)(v - line));
            if (!end || (size_t)(end - v) >= namelen)
                return -1;
            memcpy(name, v, (size_t)(end - v));
            name[end - v] = '\0';
            return 0;
        }
    }
    return -1;
}

int request_parse_multipart(const uint8_t *body, size_t len, const char *boundary, const char *field,
                            request_part *parts, int max, char *err, size_t errlen)
{
    if (len == 0 || !body) {
        snprintf(err, errlen, "multipart body is empty");
        return -1;
    }
    char delim[80];
    int dl = snprintf(delim, sizeof delim, "\r\n--%s", boundary);
    if (dl < 0 || (size_t)dl >= sizeof delim) {
        snprintf(err, errlen, "multipart boundary too long");
        return -1;
    }
    /* The first delimiter may open the body without the leading CRLF. */
    const uint8_t *p;
    if (len >= (size_t)dl - 2 && memcmp(body, delim + 2, (size_t)dl - 2) == 0)
        p = body + dl - 2;
    else {
        p = find_bytes(body, len, delim, (size_t)dl);
        if (!p) {
            snprintf(err, errlen, "multipart body has no boundary line");
            return -1;
        }
        p += dl;
    }
    const uint8_t *end = body + len;
    int found = 0;
    for (;;) {
        /* After a delimiter: "--" closes the body, else optional
         * whitespace and CRLF open a part. */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            return found;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') {
            snprintf(err, errlen, "multipart delimiter not followed by CRLF");
            return -1;
        }
        p += 2;
        const uint8_t *hdr_end = find_bytes(p, (size_t)(end - p), "\r\n\r\n", 4);
        const uint8_t *content;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            hdr_end = p; /* a part with no headers */
            content = p + 2;
        } else if (hdr_end) {
            content = hdr_end + 4;
        } else {
            snprintf(err, errlen, "multipart part headers are not terminated");
            return -1;
        }
        char name[128] = "";
        int is_field = 0;
        const uint8_t *line = p;
        while (line < hdr_end) {
            const uint8_t *eol = find_bytes(line, (size_t)(hdr_end - line), "\r\n", 2);
            if (!eol)
                eol = hdr_end;
            size_t ll = (size_t)(eol - line);
            static const char cd[] = "content-disposition:";
            if (ll > sizeof cd - 1 && strncasecmp((const char *)line, cd, sizeof cd - 1) == 0 &&
                disposition_name((const char *)line, ll, name, sizeof name) == 0)
                is_field = strcmp(name, field) == 0;
            line = eol + 2;
        }
        const uint8_t *next = find_bytes(content, (size_t)(end - content), delim, (size_t)dl);
        if (!next) {
            snprintf(err, errlen, "multipart body is truncated (no closing boundary)");
            return -1;
        }
        if (is_field) {
            if (found < max) {
                parts[found].data = content;
                parts[found].len = (size_t)(next - content);
            }
            found++;
        }
        p = next + dl;
    }
}

size_t request_unescape(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2])) {
            char hex[3] = { r[1], r[2], '\0' };
            char c = (char)strtol(hex, NULL, 16);
            if (c != '\0') {
                *w++ = c;
                r += 2;
                continue;
            }
        }
        *w++ = *r;
    }
    *w = '\0';
    return (size_t)(w - s);
}
