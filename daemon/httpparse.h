/* HTTP/1.1 request parsing, pure: a request's head from a buffer, and the
 * chunked body decoder. No I/O, no allocation (fuzzed: tests/fuzz).
 *
 * Strict where two parsers reading the same bytes differently would let a
 * request be smuggled past a proxy (RFC 9112 sections 6.3 and 11.2): one
 * Content-Length value, no Transfer-Encoding beside it, no obsolete line
 * folding, no whitespace before a header's colon, CRLF in chunk framing.
 * Lenient where it is harmless: bare LF ends a head line, empty lines
 * before the request line are skipped, HTTP/1.x with x > 1 is read as 1.1.
 *
 * A refused request still has a head: status, code and message say what
 * to answer, and method, path and version are filled when they could be
 * read (errors on /v2 paths take the Open Inference Protocol's shape). */
#ifndef RESNETD_HTTPPARSE_H
#define RESNETD_HTTPPARSE_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_HEADERS 100   /* more: 431 */
#define HTTP_MAX_ARGS 32       /* query arguments kept; more are ignored */

typedef struct http_field {
    const char *name;
    const char *value;
} http_field;

typedef struct http_head {
    const char *method;     /* "" when the request line could not be read */
    char *path;             /* percent-decoded (the unescape function), "" when unread */
    int minor;              /* HTTP/1.minor: 0 or 1 */
    int nheaders;
    http_field headers[HTTP_MAX_HEADERS];   /* names as sent; values trimmed */
    int nargs;
    http_field args[HTTP_MAX_ARGS];         /* the query's, '+' and %XX decoded */
    /* The body's framing. */
    int chunked;
    uint64_t content_length;    /* without chunked; 0 when absent */
    int keep_alive;             /* the client lets the connection live on */
    int expect_continue;        /* Expect: 100-continue (HTTP/1.1) */
    /* A refused request: status != 0, and what to answer. */
    int status;
    const char *code;
    char message[200];
} http_head;

/* Where a search for the end of a head stopped; zero it for a new head. */
typedef struct http_scan {
    size_t pos;             /* start of the first line not yet complete */
    int seen_line;          /* a non-empty line was seen (empty lines before it are skipped) */
} http_scan;

/* Length of the head in buf[0..len) (through its empty line), or 0 while
 * it is incomplete. Resumes where the last call stopped, so a head that
 * trickles in is scanned once. */
size_t http_head_end(const char *buf, size_t len, http_scan *scan);

/* Parses buf[0..n), a head as http_head_end measured it, in place (NULs
 * are written; h points into buf). unescape decodes %XX in place and
 * returns the new length (the server's: %00 stays as it is). */
void http_parse_head(char *buf, size_t n, size_t (*unescape)(char *), http_head *h);

/* The first header or query argument of that name (headers: any case),
 * or NULL. */
const char *http_header(const http_head *h, const char *name);
const char *http_arg(const http_head *h, const char *key);

/* ---- chunked bodies ------------------------------------------------------ */

typedef struct http_chunked {
    int state;
    uint64_t left;          /* data bytes left in this chunk */
    int digits;             /* of its size */
    int ws;                 /* whitespace after the size (an extension must follow) */
    size_t framing;         /* extension and trailer bytes so far (bounded) */
} http_chunked;

typedef enum {
    HTTP_CHUNK_MORE,        /* everything given was framing: send more */
    HTTP_CHUNK_DATA,        /* *data, *dlen: body bytes (within in) */
    HTTP_CHUNK_DONE,        /* the last chunk and trailer are read */
    HTTP_CHUNK_ERROR,       /* malformed: *err says how */
} http_chunk_result;

/* Reads from in[0..n) until it has data to give, needs more, ends or
 * fails; *used: bytes of in consumed (framing and data). Zero the decoder
 * for a new body. */
http_chunk_result http_chunked_step(http_chunked *d, const char *in, size_t n, size_t *used, const char **data,
                                    size_t *dlen, const char **err);

#endif
