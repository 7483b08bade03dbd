/* A streaming HTTP/1.1 response parser for resnetd-load: fed whatever bytes
 * arrive, in any split, it finds the status, whether the server will close
 * the connection, and where the response ends (Content-Length, chunked, or
 * end of stream). The body is skipped unless keep_body is set (the /metrics
 * scrape), so the load path never copies it. 1xx interim answers are
 * skipped. One parser per connection, reset with http_response_init. */
#ifndef RESNETD_HTTP_RESPONSE_H
#define RESNETD_HTTP_RESPONSE_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_RESPONSE_LINE_MAX 8192

typedef enum {
    HTTP_RESPONSE_MORE, /* needs more bytes */
    HTTP_RESPONSE_DONE, /* complete; see status and close */
    HTTP_RESPONSE_ERROR /* malformed; error says why */
} http_response_result;

typedef struct {
    int state;
    int status; /* e.g. 200, once the status line is in */
    int close; /* the server will close after this response */
    int chunked;
    int64_t content_length; /* -1 until seen */
    uint64_t remaining; /* body or chunk bytes still to come */
    char line[HTTP_RESPONSE_LINE_MAX];
    size_t line_len;
    const char *error;
    int keep_body;
    char *body; /* malloc'd, NUL-terminated, when keep_body */
    size_t body_len, body_cap;
} http_response;

/* Readies r for a response. It does not free a kept body: call
 * http_response_free first when reusing a parser with keep_body. */
void http_response_init(http_response *r, int keep_body);
void http_response_free(http_response *r);

/* Consumes bytes up to the end of one response; *used gets how many. */
http_response_result http_response_feed(http_response *r, const char *buf, size_t n, size_t *used);

/* The peer closed: DONE when the body runs to end of stream, else ERROR. */
http_response_result http_response_eof(http_response *r);

/* Whether any byte of this response has been seen. */
int http_response_started(const http_response *r);

#endif
