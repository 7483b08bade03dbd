/* libFuzzer target: the JPEG header checks and the whole decode, through
 * preprocess_jpeg, on one long-lived context (as a decode thread uses it),
 * so state left behind by a failure is exercised too. max_pixels is 4 MP
 * to keep each run fast and small; the limits are what is under test. */
#include <stdint.h>
#include <stdlib.h>
#include "image/preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static preprocess_ctx *ctx;
    static uint8_t out[PREPROCESS_CROP * PREPROCESS_CROP * 3];
    if (!ctx) {
        preprocess_options opt = { .max_pixels = 4u << 20 };
        if (!(ctx = preprocess_create(&opt)))
            abort();
    }
    char err[256] = "";
    preprocess_status s = preprocess_jpeg(ctx, data, size, out, err, sizeof err);
    if (s != PREP_OK && !err[0])
        abort();
    if (preprocess_ctx_bytes(ctx) > PREPROCESS_DEFAULT_RETAIN_BYTES)
        abort(); /* buffers over the retained size are freed after every image */
    return 0;
}
