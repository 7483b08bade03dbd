/* HTTP/1.1 request heads and chunked bodies: parsers over buffers
 * (httpparse.h says what is strict and what is lenient, and why). */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "daemon/httpparse.h"

size_t http_head_end(const char *buf, size_t len, http_scan *scan)
{
    size_t i = scan->pos;
    while (i < len) {
        const char *lf = memchr(buf + i, '\n', len - i);
        if (!lf)
            break;
        size_t j = (size_t)(lf - buf);
        int empty = j == i || (j == i + 1 && buf[i] == '\r');
        i = j + 1;
        if (empty && scan->seen_line)
            return i;
        if (!empty)
            scan->seen_line = 1;
    }
    scan->pos = i;
    return 0;
}

/* RFC 9110's tchar: what a method or a header name is made of. */
static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static void refuse(http_head *h, int status, const char *code, const char *message)
{
    if (h->status)
        return;   /* the first reason found is the one answered */
    h->status = status;
    h->code = code;
    snprintf(h->message, sizeof h->message, "%s", message);
}

/* The next line of buf[*at..end): NUL-terminated in place without its
 * CRLF or LF; NULL at the end. A CR anywhere else is left in the line,
 * where the character checks refuse it. */
static char *next_line(char *buf, size_t *at, size_t end)
{
    if (*at >= end)
        return NULL;
    char *line = buf + *at;
    char *lf = memchr(line, '\n', end - *at);
    size_t n = lf ? (size_t)(lf - line) : end - *at;
    *at += n + (lf ? 1 : 0);
    if (n > 0 && line[n - 1] == '\r')
        n--;
    line[n] = '\0';
    return line;
}

/* Splits the query in place into h->args ('+' is a space, then %XX). */
static void parse_query(char *q, size_t (*unescape)(char *), http_head *h)
{
    while (q && *q && h->nargs < HTTP_MAX_ARGS) {
        char *next = strchr(q, '&');
        if (next)
            *next++ = '\0';
        if (*q) {
            char *eq = strchr(q, '=');
            char *v = eq ? eq + 1 : q + strlen(q);
            if (eq)
                *eq = '\0';
            for (char *p = q; *p; p++)
                if (*p == '+')
                    *p = ' ';
            for (char *p = v; *p; p++)
                if (*p == '+')
                    *p = ' ';
            unescape(q);
            unescape(v);
            h->args[h->nargs++] = (http_field){ q, v };
        }
        q = next;
    }
}

/* "HTTP/d.d": 1 with *minor set, 0 malformed, -1 another major version. */
static int parse_version(const char *v, int *minor)
{
    if (strncmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' || v[7] > '9' ||
        v[8] != '\0')
        return 0;
    if (v[5] != '1')
        return -1;
    *minor = v[7] == '0' ? 0 : 1;
    return 1;
}

static void parse_request_line(char *line, size_t (*unescape)(char *), http_head *h)
{
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ')) {
        refuse(h, 400, "bad_request", "malformed request line: expected METHOD TARGET HTTP/1.1");
        return;
    }
    *sp1 = *sp2 = '\0';
    char *target = sp1 + 1, *version = sp2 + 1;
    if (sp1 == line) {
        refuse(h, 400, "bad_request", "malformed request line: no method");
        return;
    }
    for (const char *p = line; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            refuse(h, 400, "bad_request", "malformed request line: invalid character in the method");
            return;
        }
    h->method = line;
    int v = parse_version(version, &h->minor);
    if (v == 0) {
        refuse(h, 400, "bad_request", "malformed request line: the version is not HTTP/1.0 or HTTP/1.1");
        return;
    }
    for (const unsigned char *p = (const unsigned char *)target; *p; p++)
        if (*p <= ' ' || *p == 0x7f) {
            refuse(h, 400, "bad_request", "malformed request line: control character in the target");
            return;
        }
    /* Absolute form (a request through a proxy): the path is what follows
     * the authority. */
    if (strncasecmp(target, "http://", 7) == 0 || strncasecmp(target, "https://", 8) == 0) {
        char *slash = strchr(target + (target[4] == ':' ? 7 : 8), '/');
        if (slash) {
            target = slash;
        } else {
            char *q = strchr(target, '?');
            target = q ? q - 1 : target + strlen(target) - 1;
            *target = '/';
        }
    }
    if (target[0] != '/' && strcmp(target, "*") != 0) {
        refuse(h, 400, "bad_request", "malformed request line: the target is not a path");
        return;
    }
    char *q = strchr(target, '?');
    if (q)
        *q++ = '\0';
    unescape(target);
    h->path = target;
    parse_query(q, unescape, h);
    if (v < 0)
        refuse(h, 505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are supported");
}

/* One "name: value" line into h->headers. */
static void parse_field(char *line, http_head *h)
{
    if (*line == ' ' || *line == '\t') {
        refuse(h, 400, "bad_request", "obsolete header line folding is not accepted");
        return;
    }
    char *colon = strchr(line, ':');
    if (!colon || colon == line) {
        refuse(h, 400, "bad_request", "malformed header line: no field name and colon");
        return;
    }
    *colon = '\0';
    for (const char *p = line; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            refuse(h, 400, "bad_request", "malformed header line: invalid character in the field name");
            return;
        }
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        v[--n] = '\0';
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if ((*p < ' ' && *p != '\t') || *p == 0x7f) {
            refuse(h, 400, "bad_request", "control character in a header value");
            return;
        }
    if (h->nheaders == HTTP_MAX_HEADERS) {
        refuse(h, 431, "headers_too_large", "more than 100 header fields");
        return;
    }
    h->headers[h->nheaders++] = (http_field){ line, v };
}

/* Does the comma-separated list contain token (any case)? */
static int has_token(const char *list, const char *token)
{
    size_t n = strlen(token);
    for (const char *p = list; *p;) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        size_t t = len;
        while (t > 0 && (p[t - 1] == ' ' || p[t - 1] == '\t'))
            t--;
        if (t == n && strncasecmp(p, token, n) == 0)
            return 1;
        p += len;
    }
    return 0;
}

/* Framing and connection semantics from the header fields. */
static void read_fields(http_head *h)
{
    int hosts = 0, lengths = 0, encodings = 0, conflicting = 0, bad_length = 0;
    const char *length = NULL, *encoding = NULL, *expect = NULL;
    h->keep_alive = h->minor >= 1;
    for (int i = 0; i < h->nheaders; i++) {
        const char *name = h->headers[i].name, *v = h->headers[i].value;
        if (strcasecmp(name, "Host") == 0) {
            hosts++;
        } else if (strcasecmp(name, "Content-Length") == 0) {
            size_t d = strspn(v, "0123456789");
            if (d == 0 || d > 18 || v[d] != '\0')
                bad_length = 1;
            else if (lengths++ > 0 && strcmp(v, length) != 0)
                conflicting = 1;
            else
                length = v;
        } else if (strcasecmp(name, "Transfer-Encoding") == 0) {
            encodings++;
            encoding = v;
        } else if (strcasecmp(name, "Connection") == 0) {
            if (has_token(v, "close"))
                h->keep_alive = 0;
            else if (has_token(v, "keep-alive"))
                h->keep_alive = 1;
        } else if (strcasecmp(name, "Expect") == 0) {
            expect = v;
        }
    }
    if (h->minor >= 1 && hosts == 0)
        refuse(h, 400, "bad_request", "an HTTP/1.1 request must have a Host header");
    else if (hosts > 1)
        refuse(h, 400, "bad_request", "several Host headers");
    else if (bad_length)
        refuse(h, 400, "bad_request", "Content-Length is not a decimal length");
    else if (conflicting)
        refuse(h, 400, "bad_request", "conflicting Content-Length headers");
    else if (encodings && h->minor == 0)
        refuse(h, 400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request");
    else if (encodings > 1 || (encodings && lengths))
        refuse(h, 400, "bad_request",
               "ambiguous body framing: several Transfer-Encoding headers, or one with Content-Length");
    else if (encodings && strcasecmp(encoding, "chunked") != 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "Transfer-Encoding '%.80s' is not supported; send the body chunked or with a "
                 "Content-Length", encoding);
        refuse(h, 501, "not_implemented", msg);
    } else if (expect && (strcasecmp(expect, "100-continue") != 0 || h->minor < 1))
        refuse(h, 417, "expectation_failed", "the only expectation supported is 100-continue (HTTP/1.1)");
    if (h->status)
        return;
    h->chunked = encodings == 1;
    if (length)
        sscanf(length, "%llu", (unsigned long long *)&h->content_length);   /* 18 digits: no overflow */
    h->expect_continue = expect != NULL;
}

void http_parse_head(char *buf, size_t n, size_t (*unescape)(char *), http_head *h)
{
    memset(h, 0, sizeof *h);
    h->method = "";
    h->path = "";
    h->minor = 1;
    if (memchr(buf, '\0', n)) {
        /* C strings would end there: "Content-Length: 5\0junk" read as 5. */
        refuse(h, 400, "bad_request", "a NUL byte in the request head");
        return;
    }
    size_t at = 0;
    char *line;
    while ((line = next_line(buf, &at, n)) && *line == '\0')
        ;   /* empty lines before the request line */
    if (!line) {
        refuse(h, 400, "bad_request", "empty request");
        return;
    }
    parse_request_line(line, unescape, h);
    if (h->status && h->status != 505)
        return;
    while ((line = next_line(buf, &at, n)) && *line != '\0' && !h->status)
        parse_field(line, h);
    if (!h->status)
        read_fields(h);
}

const char *http_header(const http_head *h, const char *name)
{
    for (int i = 0; i < h->nheaders; i++)
        if (strcasecmp(h->headers[i].name, name) == 0)
            return h->headers[i].value;
    return NULL;
}

const char *http_arg(const http_head *h, const char *key)
{
    for (int i = 0; i < h->nargs; i++)
        if (strcmp(h->args[i].name, key) == 0)
            return h->args[i].value;
    return NULL;
}

/* ---- chunked bodies ------------------------------------------------------ */

enum {
    CH_SIZE,        /* hex digits of a chunk's size */
    CH_SIZE_WS,     /* whitespace after them: only before an extension */
    CH_EXT,         /* a chunk extension, up to CR */
    CH_SIZE_LF,     /* the LF after the size line's CR */
    CH_DATA,
    CH_DATA_CR,     /* the CRLF after a chunk's data */
    CH_DATA_LF,
    CH_TRAILER,     /* at the start of a trailer line (or the final CRLF) */
    CH_TRAILER_LINE,
    CH_TRAILER_LF,  /* a trailer line's LF after its CR */
    CH_FINAL_LF,
    CH_DONE,
};

#define CHUNK_FRAMING_MAX 16384   /* extension and trailer bytes in one body */

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

http_chunk_result http_chunked_step(http_chunked *d, const char *in, size_t n, size_t *used, const char **data,
                                    size_t *dlen, const char **err)
{
    size_t i = 0;
    *err = NULL;
    while (i < n) {
        char c = in[i];
        switch (d->state) {
        case CH_SIZE: {
            int x = hex_value(c);
            if (x >= 0) {
                if (++d->digits > 15) {
                    *err = "bad chunked encoding: chunk size too large";
                    goto fail;
                }
                d->left = d->left * 16 + (uint64_t)x;
                i++;
                continue;
            }
            if (d->digits == 0) {
                *err = "bad chunked encoding: chunk size is not hexadecimal";
                goto fail;
            }
            d->state = CH_SIZE_WS;
            continue;   /* c again, in the next state */
        }
        case CH_SIZE_WS:
            if (c == ' ' || c == '\t') {
                d->ws = 1;
                break;
            }
            if (c == ';')
                d->state = CH_EXT;
            else if (c == '\r' && !d->ws)
                d->state = CH_SIZE_LF;
            else {
                *err = "bad chunked encoding: malformed chunk size line";
                goto fail;
            }
            break;
        case CH_EXT:
            if (c == '\r')
                d->state = CH_SIZE_LF;
            else if (c == '\n' || c == '\0' || ++d->framing > CHUNK_FRAMING_MAX) {
                *err = "bad chunked encoding: malformed or oversized chunk extension";
                goto fail;
            }
            break;
        case CH_SIZE_LF:
            if (c != '\n') {
                *err = "bad chunked encoding: chunk size line not ended by CRLF";
                goto fail;
            }
            d->state = d->left == 0 ? CH_TRAILER : CH_DATA;
            break;
        case CH_DATA: {
            size_t take = n - i < d->left ? n - i : (size_t)d->left;
            d->left -= take;
            if (d->left == 0)
                d->state = CH_DATA_CR;
            *data = in + i;
            *dlen = take;
            *used = i + take;
            return HTTP_CHUNK_DATA;
        }
        case CH_DATA_CR:
        case CH_DATA_LF:
            if (c != (d->state == CH_DATA_CR ? '\r' : '\n')) {
                *err = "bad chunked encoding: chunk data not followed by CRLF";
                goto fail;
            }
            if (d->state == CH_DATA_LF) {
                d->state = CH_SIZE;
                d->digits = 0;
                d->ws = 0;
            } else {
                d->state = CH_DATA_LF;
            }
            break;
        case CH_TRAILER:
            d->state = c == '\r' ? CH_FINAL_LF : CH_TRAILER_LINE;
            if (c == '\r')
                break;
            continue;
        case CH_TRAILER_LINE:
            /* Trailer fields are skipped, but their lines end in CRLF like
             * the rest: a bare LF could end the body early for a proxy. */
            if (++d->framing > CHUNK_FRAMING_MAX || c == '\n') {
                *err = "bad chunked encoding: trailer too large or not in CRLF lines";
                goto fail;
            }
            if (c == '\r')
                d->state = CH_TRAILER_LF;
            break;
        case CH_TRAILER_LF:
            if (c != '\n') {
                *err = "bad chunked encoding: trailer line not ended by CRLF";
                goto fail;
            }
            d->state = CH_TRAILER;
            break;
        case CH_FINAL_LF:
            if (c != '\n') {
                *err = "bad chunked encoding: body not ended by an empty line";
                goto fail;
            }
            d->state = CH_DONE;
            *used = i + 1;
            return HTTP_CHUNK_DONE;
        default:   /* CH_DONE */
            *used = i;
            return HTTP_CHUNK_DONE;
        }
        i++;
    }
    *used = i;
    return d->state == CH_DONE ? HTTP_CHUNK_DONE : HTTP_CHUNK_MORE;
fail:
    *used = i;
    return HTTP_CHUNK_ERROR;
}
