/* The dynamic batcher: one thread per engine that takes images off the
 * queue in batches, as the batch policy (daemon/pipeline/batch_policy.h) decides,
 * and hands them to the engine. */
#ifndef RESNETD_BATCHER_H
#define RESNETD_BATCHER_H

#include <stdint.h>
#include "daemon/pipeline/batch_policy.h"
#include "daemon/pipeline/pipeline.h"
#include "image/devjpeg.h"

/* Has the client on socket fd (-1: none) gone (reset the connection)? A
 * half-closed client still wants its answer and is not gone. A suspended
 * connection does not notice by itself; the batcher and the decode pool
 * check before spending work on a request. */
int batcher_client_gone(int fd);

struct queue;
struct infer;
typedef struct batcher batcher;

/* Starts the batcher thread. It runs until queue_stop() and an empty queue.
 * dj: the device decoder for queued compressed JPEGs (NULL: none; then
 * every item's crop is in its queue slot); the batcher decodes the images
 * the device fails on with a CPU decoder limited to max_pixels. */
batcher *batcher_start(struct queue *q, struct infer *inf, const batch_policy *p, const pipeline_sink *sink,
                       devjpeg *dj, uint64_t max_pixels, char *err, size_t errlen);
/* Joins the thread (call after queue_stop) and frees the batcher. */
void batcher_join(batcher *b);

#endif
