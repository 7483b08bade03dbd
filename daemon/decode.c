/* Per-thread preprocess contexts behind a pthread key, whose destructor
 * frees a worker's context when libmicrohttpd ends the thread. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "daemon/decode.h"

static pthread_key_t ctx_key;
static preprocess_options options;

static void ctx_destroy(void *p)
{
    if (p)
        preprocess_destroy(p);
}

int decode_init(uint64_t max_pixels, char *err, size_t errlen)
{
    options.max_pixels = max_pixels;
    options.fast = 0;   /* exact torchvision preprocessing, as resnetd-classify */
    int rc = pthread_key_create(&ctx_key, ctx_destroy);
    if (rc != 0) {
        snprintf(err, errlen, "decode: pthread_key_create: %s", strerror(rc));
        return -1;
    }
    return 0;
}

preprocess_status decode_jpeg(const uint8_t *jpeg, size_t len, uint8_t *out, char *err, size_t errlen)
{
    preprocess_ctx *p = pthread_getspecific(ctx_key);
    if (!p) {
        p = preprocess_create(&options);
        if (!p || pthread_setspecific(ctx_key, p) != 0) {
            if (p)
                preprocess_destroy(p);
            snprintf(err, errlen, "out of memory for a decoder");
            return PREP_ERR_NOMEM;
        }
    }
    return preprocess_jpeg(p, jpeg, len, out, err, errlen);
}

int decode_http_status(preprocess_status s)
{
    switch (s) {
    case PREP_OK: return 200;
    case PREP_ERR_EMPTY:
    case PREP_ERR_CORRUPT: return 400;
    case PREP_ERR_TOO_LARGE: return 413;
    case PREP_ERR_NOT_JPEG:
    case PREP_ERR_UNSUPPORTED: return 415;
    default: return 500;
    }
}

void decode_thread_done(void)
{
    preprocess_ctx *p = pthread_getspecific(ctx_key);
    if (p) {
        preprocess_destroy(p);
        pthread_setspecific(ctx_key, NULL);
    }
}
