/* The decode stage: a request's images, from its complete body to the
 * batcher's queue.
 *
 * One call takes a request whose queue slots are reserved. Each image's
 * header is read; with GPU decoding, a JPEG the device takes (and whose
 * cost the router gives to the GPU) goes to the queue compressed, and
 * anything else is decoded by a decode thread into its slot. v2 pixel and
 * FP32 tensors are resized or passed on instead. The images are then pushed
 * to the queue, or the request fails (request_fail), its slots are
 * released and its connection is woken to answer. Reasons for leaving the
 * device, decode times and the CPU's measured cost are counted in metrics.
 *
 * Threads: a pool of decode threads (daemon/pipeline/decode_pool.h) does the work;
 * with GPU decoding and every decode thread busy, a request whose every
 * image the device takes has its headers read on the calling HTTP thread
 * instead, so it does not wait behind CPU decodes. */
#ifndef RESNETD_DECODE_H
#define RESNETD_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/http/budget.h"
#include "daemon/pipeline/queue.h"
#include "daemon/api/request.h"
#include "daemon/pipeline/route.h"
#include "image/devjpeg.h"

typedef struct decode_stage decode_stage;

typedef struct decode_stage_config {
    int threads; /* decode threads */
    int http_threads; /* GPU decoding: one header reader each */
    uint64_t max_pixels;
    /* GPU decoding: when decode threads decode JPEGs the device could
     * take: -1 when the CPU answers them sooner (by measured cost, route),
     * N > 0 past a queue depth of N, 0 never. */
    int assist_depth;
    queue *q;
    devjpeg *dj; /* GPU decoding, or NULL */
    decode_route *route; /* with dj: the measured costs */
    budget *bodies; /* decode scratch is charged here */
} decode_stage_config;

/* Starts the decode threads (start-up: errors name the reason). */
decode_stage *decode_stage_start(const decode_stage_config *cfg, char *err, size_t errlen);

/* Takes r, whose r->nimages slots are reserved, from HTTP thread
 * http_worker; its images reach the queue, or it fails and is woken. */
void decode_stage_submit(decode_stage *d, request *r, int http_worker);

/* Requests a decode thread is working on now. */
long decode_stage_running(decode_stage *d);

/* Refuses new requests (each fails 503) and fails every waiting one;
 * running decodes finish. Returns how many were failed. */
int decode_stage_refuse(decode_stage *d);

/* Drain timeout: decode_stage_refuse, and running decodes stop too
 * (between images, or inside libjpeg). */
int decode_stage_cancel(decode_stage *d);

/* Fails whatever still waits, joins the threads, frees the stage. */
void decode_stage_stop(decode_stage *d);

#endif
