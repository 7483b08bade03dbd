/* The decode stage (daemon/pipeline/decode.h): header checks, the GPU-or-CPU
 * choice per image, CPU decoding into queue slots, v2 tensors, and the push
 * to the batcher's queue. The pool (daemon/pipeline/decode_pool.h) only schedules;
 * what a job does is here. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/pipeline/batcher.h"
#include "daemon/pipeline/decode.h"
#include "daemon/pipeline/decode_pool.h"
#include "daemon/http/http.h"
#include "daemon/api/metrics.h"
#include "daemon/api/v2.h"
#include "util/clock.h"

struct decode_stage {
    decode_pool *pool;
    queue *q;
    devjpeg *dj;
    decode_route *route;
    budget *bodies;
    int threads;
    int assist_depth; /* as decode_stage_config's */
    preprocess_ctx **header_ctx; /* GPU decoding: one per HTTP thread (gpu_headers_here) */
    int nheader_ctx;
    atomic_long decoding; /* requests a decode thread is working on */
    atomic_int decodes_cancelled; /* drain timeout: decodes stop (between images, or in libjpeg) */
};

/* On a decode thread, with the connection suspended: a failure releases
 * the slots, records the answer and resumes the connection. */
static void decode_failed(decode_stage *d, request *r, int status, const char *code, const char *message)
{
    queue_release(d->q, r->slots, r->nimages);
    request_fail(r, status, code, message);
    http_wake(r->conn);
}

/* The decode's stop hook: the drain timeout and the request's deadline on
 * every call (a load and a clock read), its client at most every 10 ms (a
 * poll). */
typedef struct decode_watch {
    decode_stage *d;
    const request *r;
    uint64_t next_client_check_us;
    int status; /* 503, 504 or 499 once it said stop */
} decode_watch;

static int decode_should_stop(void *cls)
{
    decode_watch *w = cls;
    if (atomic_load(&w->d->decodes_cancelled)) {
        w->status = 503;
        return 1;
    }
    uint64_t now = clock_now_us();
    if (now >= w->r->deadline_us) {
        w->status = 504;
        return 1;
    }
    if (now >= w->next_client_check_us) {
        w->next_client_check_us = now + 10000;
        if (batcher_client_gone(w->r->fd)) {
            w->status = 499;
            return 1;
        }
    }
    return 0;
}

/* With GPU decoding: does image i, whose header the CPU has read (info),
 * go to the device? 1 when it goes to the queue compressed, 0 when the CPU
 * decodes it: the device cannot, or (assist by cost: *by_cost set) this
 * thread answers it sooner than the device's backlog would; the reason is
 * counted. */
static int gpu_route(decode_stage *d, const preprocess_info *info, request *r, int i, queue_item *it, int *by_cost)
{
    devjpeg_reason dr = devjpeg_check(d->dj, r->parts[i].data, r->parts[i].len, info);
    if (dr == DEVJPEG_OK && d->assist_depth < 0 &&
        decode_route_to_cpu(d->route, info->w, info->h, queue_jpeg_pixels(d->q))) {
        dr = DEVJPEG_SATURATED;
        *by_cost = 1;
    }
    if (dr != DEVJPEG_OK) {
        metrics_add_decode_fallback(dr, 1);
        return 0;
    }
    it->jpeg = r->parts[i].data;
    it->jpeg_len = r->parts[i].len;
    it->w = info->w;
    it->h = info->h;
    return 1;
}

/* Pushes r's n images, in their slots or described by items, to the
 * batcher's queue. */
static void push_images(decode_stage *d, request *r, queue_item *items, int n)
{
    uint64_t now = clock_now_us();
    for (int i = 0; i < n; i++) {
        items[i].enqueued_us = now;
        items[i].deadline_us = r->deadline_us;
    }
    atomic_store(&r->pending, n);
    queue_push(d->q, items, n);
}

/* With GPU decoding, a request whose every image the device takes needs
 * only its headers read on the CPU. While every decode thread is busy that
 * is done here, on the HTTP thread, so it does not wait in the pool behind
 * CPU decodes (progressive files and other fallbacks take ~12 ms each:
 * with a tenth of the images progressive the pool's threads were busy
 * often enough to starve the GPU); with a thread idle the pool takes it,
 * spreading the header reads. Anything else (an image the device refuses,
 * a bad header, CPU assist) goes to the pool, which decides, answers and
 * counts as before. Returns 1 when the images are queued. */
static int gpu_headers_here(decode_stage *d, request *r, int http_worker)
{
    if (!d->dj || (r->v2 && r->v2->kind != V2_IN_JPEG) ||
        (d->assist_depth > 0 && queue_depth(d->q) >= d->assist_depth) || decode_pool_busy(d->pool) < d->threads)
        return 0;
    preprocess_ctx *ctx = d->header_ctx[http_worker];
    queue_item items[REQUEST_MAX_IMAGES];
    uint64_t t0 = clock_now_us();
    for (int i = 0; i < r->nimages; i++) {
        preprocess_info info;
        char why[256];
        if (preprocess_header(ctx, r->parts[i].data, r->parts[i].len, &info, why, sizeof why) != PREP_OK ||
            devjpeg_check(d->dj, r->parts[i].data, r->parts[i].len, &info) != DEVJPEG_OK)
            return 0;
        items[i] = (queue_item){ .req = r,
                                 .image = i,
                                 .slot = r->slots[i],
                                 .fd = r->fd,
                                 .jpeg = r->parts[i].data,
                                 .jpeg_len = r->parts[i].len,
                                 .w = info.w,
                                 .h = info.h };
    }
    r->decode_us += clock_now_us() - t0;
    push_images(d, r, items, r->nimages);
    return 1;
}

/* A v2 request's pixel or FP32 tensors: pixels are resized and cropped
 * into their slots as decoded JPEGs are (preprocess_resize_crop, so the
 * same pixels give /classify's answer), with the resize's scratch charged
 * to the memory budget; FP32 images go as they are. */
static void tensor_images(decode_stage *d, request *r)
{
    const v2_infer *v = r->v2;
    const int n = v->n;
    queue_item items[REQUEST_MAX_IMAGES];
    uint8_t *scratch = NULL;
    size_t scratch_bytes = 0;
    char msg[256];
    if (v->kind == V2_IN_PIXELS) {
        scratch_bytes = preprocess_scratch_bytes(v->w, v->h);
        if (scratch_bytes + r->cap > budget_cap(d->bodies)) {
            snprintf(msg, sizeof msg,
                     "resizing %dx%d pixels needs %zu bytes, with the request's body more than "
                     "body_memory_bytes (%zu)",
                     v->w, v->h, scratch_bytes, budget_cap(d->bodies));
            decode_failed(d, r, 413, "too_large", msg);
            return;
        }
        if (budget_try_acquire(d->bodies, scratch_bytes) != 0) {
            decode_failed(d, r, 503, "memory_full", "the memory budget is full; retry later");
            return;
        }
        if (!(scratch = malloc(scratch_bytes ? scratch_bytes : 1))) {
            budget_release(d->bodies, scratch_bytes);
            decode_failed(d, r, 500, "internal", "out of memory");
            return;
        }
    }
    const size_t image_bytes = (size_t)v->w * (size_t)v->h * 3;
    for (int i = 0; i < n; i++) {
        items[i] = (queue_item){ .req = r, .image = i, .slot = r->slots[i], .fd = r->fd };
        if (v->kind == V2_IN_TENSOR) {
            items[i].f32 = v->tensor + (size_t)i * RESNET18_INPUT_BYTES;
            continue;
        }
        if (atomic_load(&d->decodes_cancelled) || clock_now_us() >= r->deadline_us) {
            free(scratch);
            budget_release(d->bodies, scratch_bytes);
            if (atomic_load(&d->decodes_cancelled))
                decode_failed(d, r, 503, "shutting_down", "the server stopped while this request was resized");
            else
                decode_failed(d, r, 504, "timeout", "request_timeout_ms passed while resizing its images");
            return;
        }
        uint64_t t0 = clock_now_us();
        preprocess_resize_crop(v->pixels + (size_t)i * image_bytes, v->w, v->h, queue_slot(d->q, r->slots[i]), scratch);
        r->decode_us += clock_now_us() - t0;
    }
    free(scratch);
    budget_release(d->bodies, scratch_bytes);
    request_drop_body(r); /* the crops are in the slots; FP32 tensors are the v2_infer's */
    push_images(d, r, items, n);
}

/* Decodes every image of r into its slot (or, with GPU decoding, checks it
 * and leaves it compressed for the batcher) and pushes them to the
 * batcher's queue, or answers the request. A CPU decode stops when the
 * request's deadline passes or its client leaves. */
static void decode_images(decode_stage *d, request *r, preprocess_ctx *ctx)
{
    char msg[384], why[256];
    if (batcher_client_gone(r->fd)) {
        decode_failed(d, r, 499, "client_gone", "the client closed the connection");
        return;
    }
    if (clock_now_us() >= r->deadline_us) {
        decode_failed(d, r, 504, "timeout", "the request waited for a decoder past request_timeout_ms");
        return;
    }
    if (r->v2 && r->v2->kind != V2_IN_JPEG) {
        tensor_images(d, r);
        return;
    }
    int n = r->nimages, compressed = 0;
    queue_item items[REQUEST_MAX_IMAGES];
    decode_watch watch = { .d = d, .r = r };
    /* cpu_decode_assist = N: N images already wait, so the GPU decoder is
     * the bottleneck and this thread is free: it decodes this request
     * itself and adds its throughput to the hardware's. (By cost, the
     * choice is per image, in gpu_route.) */
    const int assist = d->dj && d->assist_depth > 0 && queue_depth(d->q) >= d->assist_depth;
    for (int i = 0; i < n; i++) {
        /* Past the drain timeout, a long multi-image decode stops here
         * rather than holding the exit. */
        if (atomic_load(&d->decodes_cancelled)) {
            decode_failed(d, r, 503, "shutting_down", "the server stopped before this request was decoded");
            return;
        }
        uint64_t t0 = clock_now_us();
        items[i] = (queue_item){ .req = r, .image = i, .slot = r->slots[i], .fd = r->fd };
        preprocess_info info;
        int by_cost = 0; /* a JPEG the device takes, decoded here as sooner: a sample of the CPU's cost */
        preprocess_status st = preprocess_header(ctx, r->parts[i].data, r->parts[i].len, &info, why, sizeof why);
        if (st == PREP_OK && d->dj && assist) {
            metrics_add_decode_fallback(DEVJPEG_SATURATED, 1);
        } else if (st == PREP_OK && d->dj && gpu_route(d, &info, r, i, &items[i], &by_cost)) {
            r->decode_us += clock_now_us() - t0;
            compressed++;
            continue;
        }
        /* What the decode will hold counts against the memory budget, with
         * the request bodies, while it runs: more than the whole budget can
         * never fit (413), more than what is free now can later (503). */
        if (st == PREP_OK && info.decode_bytes + r->cap > budget_cap(d->bodies)) {
            snprintf(msg, sizeof msg,
                     "image %d needs %zu bytes to decode, with its request's body more than "
                     "body_memory_bytes (%zu)",
                     i, info.decode_bytes, budget_cap(d->bodies));
            decode_failed(d, r, 413, "too_large", msg);
            return;
        }
        if (st == PREP_OK && budget_try_acquire(d->bodies, info.decode_bytes) != 0) {
            snprintf(msg, sizeof msg, "image %d needs %zu bytes to decode and the memory budget is full; retry later",
                     i, info.decode_bytes);
            decode_failed(d, r, 503, "memory_full", msg);
            return;
        }
        if (st == PREP_OK) {
            preprocess_set_stop(ctx, decode_should_stop, &watch);
            st = preprocess_jpeg(ctx, r->parts[i].data, r->parts[i].len, queue_slot(d->q, r->slots[i]), why,
                                 sizeof why);
            preprocess_set_stop(ctx, NULL, NULL);
            budget_release(d->bodies, info.decode_bytes);
        }
        uint64_t dt = clock_now_us() - t0;
        r->decode_us += dt;
        if (st == PREP_ERR_STOPPED && watch.status == 499) {
            decode_failed(d, r, 499, "client_gone", "the client closed the connection");
            return;
        }
        if (st == PREP_ERR_STOPPED && watch.status == 503) {
            decode_failed(d, r, 503, "shutting_down", "the server stopped while this request was decoded");
            return;
        }
        if (st == PREP_ERR_STOPPED) {
            snprintf(msg, sizeof msg, "request_timeout_ms passed while decoding image %d", i);
            decode_failed(d, r, 504, "timeout", msg);
            return;
        }
        if (st != PREP_OK) {
            /* curl -d @FILE sends this type and drops the file's CR and LF bytes. */
            const char *hint = st == PREP_ERR_CORRUPT && r->form_type
                                   ? " (curl -d removes line breaks from a file: send it with --data-binary @FILE)"
                                   : "";
            if (n > 1)
                snprintf(msg, sizeof msg, "image %d: %s%s", i, why, hint);
            else
                snprintf(msg, sizeof msg, "%s%s", why, hint);
            decode_failed(d, r, decode_http_status(st), preprocess_status_code(st), msg);
            return;
        }
        metrics_observe_decode((double)dt / 1e6);
        metrics_add_decoded(METRICS_DECODE_CPU, 1);
        /* Only decodes of JPEGs the device takes teach the router what the
         * choice costs (progressive or refused files cost otherwise). */
        if (d->route && by_cost) {
            decode_route_cpu(d->route, info.w, info.h, dt * 1000);
            int cls = decode_route_class(info.w, info.h);
            metrics_set_decode_cost(cls, decode_route_cpu_ps(d->route, cls));
        }
    }
    /* The crops are in the slots: the body is no longer needed, unless the
     * GPU still has JPEGs in it to decode. */
    if (compressed == 0)
        request_drop_body(r);
    push_images(d, r, items, n);
}

/* The decode pool's run. */
static void decode_run(void *cls, decode_job *job, preprocess_ctx *ctx)
{
    decode_stage *d = cls;
    atomic_fetch_add(&d->decoding, 1);
    decode_images(d, job->owner, ctx);
    atomic_fetch_sub(&d->decoding, 1);
}

/* A job the pool will not run (drain timeout, or submitted after it). */
static void decode_cancel(void *cls, decode_job *job)
{
    decode_failed(cls, job->owner, 503, "shutting_down", "the server stopped before this request ran");
}

/* ---- lifecycle ---------------------------------------------------------- */

decode_stage *decode_stage_start(const decode_stage_config *cfg, char *err, size_t errlen)
{
    decode_stage *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "decode: out of memory");
        return NULL;
    }
    d->q = cfg->q;
    d->dj = cfg->dj;
    d->route = cfg->route;
    d->bodies = cfg->bodies;
    d->threads = cfg->threads;
    d->assist_depth = cfg->assist_depth;
    if (d->assist_depth > queue_capacity(d->q)) /* a depth the queue never reaches: at a full queue */
        d->assist_depth = queue_capacity(d->q);
    atomic_init(&d->decoding, 0);
    atomic_init(&d->decodes_cancelled, 0);
    if (d->dj) {
        preprocess_options po = { .max_pixels = cfg->max_pixels };
        d->header_ctx = calloc((size_t)cfg->http_threads, sizeof *d->header_ctx);
        for (d->nheader_ctx = 0; d->header_ctx && d->nheader_ctx < cfg->http_threads; d->nheader_ctx++)
            if (!(d->header_ctx[d->nheader_ctx] = preprocess_create(&po)))
                break;
        if (d->nheader_ctx < cfg->http_threads) {
            snprintf(err, errlen, "decode: out of memory for the HTTP threads' JPEG header readers");
            decode_stage_stop(d);
            return NULL;
        }
    }
    decode_pool_ops ops = { .cls = d, .run = decode_run, .cancel = decode_cancel };
    const preprocess_options po_decode = devjpeg_cpu_options(d->dj, cfg->max_pixels);
    if (!(d->pool = decode_pool_start(cfg->threads, &po_decode, &ops, err, errlen))) {
        decode_stage_stop(d);
        return NULL;
    }
    return d;
}

void decode_stage_submit(decode_stage *d, request *r, int http_worker)
{
    if (!gpu_headers_here(d, r, http_worker))
        (void)decode_pool_submit(d->pool, &r->job);
}

long decode_stage_running(decode_stage *d)
{
    return atomic_load(&d->decoding);
}

int decode_stage_refuse(decode_stage *d)
{
    return decode_pool_abort(d->pool);
}

int decode_stage_cancel(decode_stage *d)
{
    atomic_store(&d->decodes_cancelled, 1);
    return decode_pool_abort(d->pool);
}

void decode_stage_stop(decode_stage *d)
{
    if (!d)
        return;
    if (d->pool)
        decode_pool_stop(d->pool);
    for (int i = 0; i < d->nheader_ctx; i++)
        preprocess_destroy(d->header_ctx[i]);
    free(d->header_ctx);
    free(d);
}
