/* libFuzzer target: the Content-Type parser and the multipart splitter.
 * Input: a Content-Type line, '\n', then the body. The body is parsed with
 * the boundary the line gives (when it is multipart) and with a fixed one;
 * every part found must lie inside the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_parts(const uint8_t *body, size_t len, const char *boundary)
{
    request_part parts[8];
    char err[256] = "";
    int n = request_parse_multipart(body, len, boundary, "image", parts, 8, err, sizeof err);
    if (n < 0 && !err[0])
        abort(); /* a refusal always says why */
    for (int i = 0; i < n && i < 8; i++)
        if (parts[i].data < body || parts[i].data + parts[i].len > body + len)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t hl = nl ? (size_t)(nl - data) : size;
    char *ct = malloc(hl + 1);
    if (!ct)
        return 0;
    memcpy(ct, data, hl);
    ct[hl] = '\0';
    /* The body in its own exact-size buffer, so ASan sees any overread. */
    size_t len = nl ? size - hl - 1 : 0;
    uint8_t *body = len ? malloc(len) : NULL;
    if (len && !body) {
        free(ct);
        return 0;
    }
    if (len)
        memcpy(body, nl + 1, len);
    request_body_kind kind;
    char boundary[72];
    if (request_parse_content_type(ct, &kind, boundary, sizeof boundary) == 0 && kind == REQ_BODY_MULTIPART) {
        if (strlen(boundary) == 0 || strlen(boundary) > 70)
            abort();
        check_parts(body, len, boundary);
    }
    check_parts(body, len, "B");
    free(body);
    free(ct);
    return 0;
}
