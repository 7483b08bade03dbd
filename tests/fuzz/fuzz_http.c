/* libFuzzer target: what a client's bytes go through before the server
 * sees a request: the head's end, the head parser, and the chunked
 * decoder on what follows. Properties: the head's end is the same fed
 * whole or in two pieces; every pointer the head holds lies in the buffer
 * (or is a constant); a refusal has a code and message; the decoder's
 * data lies within its input and it never consumes past it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/httpparse.h"
#include "daemon/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int within(const char *p, const char *buf, size_t n)
{
    return p >= buf && p <= buf + n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);   /* no terminator: a read past the end is caught */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    http_scan whole = { 0 }, split = { 0 };
    size_t end = http_head_end(buf, size, &whole);
    size_t half = size / 2, end2 = http_head_end(buf, half, &split);
    if (end2 == 0)
        end2 = http_head_end(buf, size, &split);
    if (end2 != end || end > size)
        abort();
    size_t body_at = end;
    if (end > 0) {
        http_head h;
        http_parse_head(buf, end, request_unescape, &h);
        if (h.status && (!h.code || !h.message[0]))
            abort();
        if (*h.method && !within(h.method, buf, end))
            abort();
        if (*h.path && !within(h.path, buf, end))
            abort();
        for (int i = 0; i < h.nheaders; i++)
            if (!within(h.headers[i].name, buf, end) || !within(h.headers[i].value, buf, end))
                abort();
        for (int i = 0; i < h.nargs; i++)
            if (!within(h.args[i].name, buf, end) || !within(h.args[i].value, buf, end))
                abort();
    }
    http_chunked d = { 0 };
    size_t at = body_at;
    for (;;) {
        size_t used = 0, dlen = 0;
        const char *dp = NULL, *err = NULL;
        http_chunk_result r = http_chunked_step(&d, buf + at, size - at, &used, &dp, &dlen, &err);
        if (used > size - at)
            abort();
        if (r == HTTP_CHUNK_DATA && (dp < buf + at || dp + dlen > buf + at + used || dlen == 0))
            abort();
        if (r == HTTP_CHUNK_ERROR && !err)
            abort();
        at += used;
        if (r != HTTP_CHUNK_DATA)
            break;
    }
    free(buf);
    return 0;
}
