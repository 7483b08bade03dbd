/* Streaming HTTP/1.1 response parser (see http_response.h). Lines (status,
 * headers, chunk sizes, trailers) are assembled byte by byte into r->line;
 * body bytes are skipped (or kept) in bulk. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "client/http_response.h"

enum {
    ST_START, /* nothing seen yet */
    ST_STATUS,
    ST_HEADER,
    ST_BODY, /* r->remaining bytes of Content-Length body */
    ST_EOF_BODY, /* body runs until the server closes */
    ST_CHUNK_SIZE,
    ST_CHUNK_DATA,
    ST_CHUNK_END, /* the CRLF after a chunk's data */
    ST_TRAILER,
    ST_DONE
};

void http_response_init(http_response *r, int keep_body)
{
    r->state = ST_START;
    r->status = 0;
    r->close = 0;
    r->chunked = 0;
    r->content_length = -1;
    r->remaining = 0;
    r->line_len = 0;
    r->error = NULL;
    r->keep_body = keep_body;
    r->body = NULL;
    r->body_len = r->body_cap = 0;
}

void http_response_free(http_response *r)
{
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
}

int http_response_started(const http_response *r)
{
    return r->state != ST_START;
}

static http_response_result fail(http_response *r, const char *why)
{
    r->error = why;
    return HTTP_RESPONSE_ERROR;
}

static int keep(http_response *r, const char *p, size_t n)
{
    if (!r->keep_body)
        return 0;
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        char *b = realloc(r->body, cap);
        if (!b)
            return -1;
        r->body = b;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

/* Case-insensitive header match: returns the value (spaces skipped) or NULL. */
static const char *header_value(const char *line, const char *name)
{
    size_t n = strlen(name);
    if (strncasecmp(line, name, n) != 0 || line[n] != ':')
        return NULL;
    line += n + 1;
    while (*line == ' ' || *line == '\t')
        line++;
    return line;
}

static int has_token(const char *value, const char *token)
{
    size_t n = strlen(token);
    for (const char *p = value; *p; p++)
        if (strncasecmp(p, token, n) == 0 && (p == value || !isalnum((unsigned char)p[-1])) &&
            !isalnum((unsigned char)p[n]))
            return 1;
    return 0;
}

/* The headers are in: decide how the body is framed. */
static void headers_done(http_response *r)
{
    if (r->status >= 100 && r->status < 200) {
        http_response_init(r, r->keep_body); /* no body bytes yet: nothing to free */
        r->state = ST_STATUS;
        return;
    }
    if (r->status == 204 || r->status == 304) {
        r->state = ST_DONE;
    } else if (r->chunked) {
        r->state = ST_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        r->remaining = (uint64_t)r->content_length;
        r->state = r->remaining ? ST_BODY : ST_DONE;
    } else {
        r->close = 1;
        r->state = ST_EOF_BODY;
    }
}

static http_response_result line_done(http_response *r)
{
    r->line[r->line_len] = '\0';
    if (r->line_len > 0 && r->line[r->line_len - 1] == '\r')
        r->line[--r->line_len] = '\0';
    const char *l = r->line, *v;
    r->line_len = 0;
    switch (r->state) {
    case ST_STATUS: {
        /* HTTP/1.x SSS reason */
        if (strncmp(l, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)l[7]) || l[8] != ' ' ||
            !isdigit((unsigned char)l[9]) || !isdigit((unsigned char)l[10]) || !isdigit((unsigned char)l[11]) ||
            (l[12] != ' ' && l[12] != '\0'))
            return fail(r, "bad status line");
        r->status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
        r->close = l[7] == '0'; /* HTTP/1.0 closes unless it says keep-alive */
        r->state = ST_HEADER;
        return HTTP_RESPONSE_MORE;
    }
    case ST_HEADER:
        if (*l == '\0') {
            headers_done(r);
            return r->state == ST_DONE ? HTTP_RESPONSE_DONE : HTTP_RESPONSE_MORE;
        }
        if ((v = header_value(l, "Content-Length")) != NULL) {
            char *end;
            if (!isdigit((unsigned char)*v))
                return fail(r, "bad Content-Length");
            unsigned long long n = strtoull(v, &end, 10);
            while (*end == ' ' || *end == '\t')
                end++;
            if (*end != '\0' || n > INT64_MAX)
                return fail(r, "bad Content-Length");
            r->content_length = (int64_t)n;
        } else if ((v = header_value(l, "Transfer-Encoding")) != NULL) {
            r->chunked = has_token(v, "chunked");
        } else if ((v = header_value(l, "Connection")) != NULL) {
            if (has_token(v, "close"))
                r->close = 1;
            else if (has_token(v, "keep-alive"))
                r->close = 0;
        }
        return HTTP_RESPONSE_MORE;
    case ST_CHUNK_SIZE: {
        char *end;
        if (!isxdigit((unsigned char)*l))
            return fail(r, "bad chunk size");
        unsigned long long n = strtoull(l, &end, 16);
        if (*end != '\0' && *end != ';' && *end != ' ')
            return fail(r, "bad chunk size");
        r->remaining = n;
        r->state = n ? ST_CHUNK_DATA : ST_TRAILER;
        return HTTP_RESPONSE_MORE;
    }
    case ST_CHUNK_END:
        if (*l != '\0')
            return fail(r, "chunk data longer than its size");
        r->state = ST_CHUNK_SIZE;
        return HTTP_RESPONSE_MORE;
    case ST_TRAILER:
        if (*l == '\0') {
            r->state = ST_DONE;
            return HTTP_RESPONSE_DONE;
        }
        return HTTP_RESPONSE_MORE;
    default: return fail(r, "parser state");
    }
}

http_response_result http_response_feed(http_response *r, const char *buf, size_t n, size_t *used)
{
    size_t i = 0;
    http_response_result res = HTTP_RESPONSE_MORE;
    if (r->state == ST_START && n > 0)
        r->state = ST_STATUS;
    while (i < n && res == HTTP_RESPONSE_MORE) {
        switch (r->state) {
        case ST_BODY:
        case ST_CHUNK_DATA:
        case ST_EOF_BODY: {
            size_t take = n - i;
            if (r->state != ST_EOF_BODY && take > r->remaining)
                take = (size_t)r->remaining;
            if (keep(r, buf + i, take) != 0)
                return fail(r, "out of memory");
            i += take;
            if (r->state == ST_EOF_BODY)
                break;
            r->remaining -= take;
            if (r->remaining == 0) {
                if (r->state == ST_BODY) {
                    r->state = ST_DONE;
                    res = HTTP_RESPONSE_DONE;
                } else {
                    r->state = ST_CHUNK_END;
                }
            }
            break;
        }
        case ST_DONE: res = HTTP_RESPONSE_DONE; break;
        default: {
            char c = buf[i++];
            if (c == '\n') {
                res = line_done(r);
            } else if (r->line_len + 1 >= sizeof r->line) {
                res = fail(r, "header line too long");
            } else {
                r->line[r->line_len++] = c;
            }
        }
        }
    }
    *used = i;
    return res;
}

http_response_result http_response_eof(http_response *r)
{
    if (r->state == ST_EOF_BODY) {
        r->state = ST_DONE;
        return HTTP_RESPONSE_DONE;
    }
    if (r->state == ST_DONE)
        return HTTP_RESPONSE_DONE;
    return fail(r, r->state == ST_START ? "connection closed before any answer" : "connection closed mid-answer");
}
