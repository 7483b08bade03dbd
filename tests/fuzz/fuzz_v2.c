/* libFuzzer target: the Open Inference Protocol v2 request parser and the
 * response built from what it accepts. Input: one byte choosing whether
 * the body has an Inference-Header-Content-Length (and where, as a share
 * of the rest), then the body. Every JPEG part must lie inside the body or
 * the parsed request's own memory, and a refusal must say why and leave
 * nothing charged to the budget. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/v2.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t len = size - 1;
    long hl = data[0] == 0 ? -1 : (long)(len * data[0] / 255);
    /* The body in its own exact-size buffer, so ASan sees any overread. */
    uint8_t *body = malloc(len ? len : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, len);
    static const v2_limits lim = { .max_images = 8, .max_pixels = 4096, .classes = 10 };
    budget b;
    budget_init(&b, 64 << 20);
    v2_infer v;
    request_part parts[8];
    const char *code = NULL;
    char err[256] = "";
    int rc = v2_parse_infer(body, len, hl, &lim, &b, &v, parts, &code, err, sizeof err);
    if (rc != 0) {
        if (!code || !err[0] || budget_used(&b) != 0)
            abort();
    } else {
        if (v.kind == V2_IN_JPEG)
            for (int i = 0; i < v.n; i++) {
                const uint8_t *p = parts[i].data;
                int in_body = p >= body && p + parts[i].len <= body + len;
                int in_owned = v.owned && p >= v.owned;
                if (parts[i].len && !in_body && !in_owned)
                    abort();
            }
        float *logits = calloc((size_t)v.n * (size_t)lim.classes, sizeof *logits);
        if (logits) {
            size_t n, jl;
            free(v2_response_infer(&v, logits, lim.classes, NULL, &n, &jl));
            free(logits);
        }
        v2_infer_free(&v);
        if (budget_used(&b) != 0)
            abort();
    }
    free(body);
    return 0;
}
