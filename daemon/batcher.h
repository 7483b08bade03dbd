/* The dynamic batcher: one thread that takes decoded images off the queue
 * in batches and hands them to the engine, and the pure decision function
 * it runs (state, now -> send N now | wait T us), which tests drive with a
 * fake clock.
 *
 * Policy, as Triton's dynamic batcher: a full batch goes at once; a
 * preferred size goes as soon as it can be formed; otherwise the batcher
 * waits until the oldest image has waited max_delay_us, then sends what is
 * there. While draining it sends at once. */
#ifndef RESNETD_BATCHER_H
#define RESNETD_BATCHER_H

#include <stdint.h>
#include "daemon/pipeline.h"
#include "model/devjpeg.h"

#define BATCHER_MAX_PREFERRED 16
#define BATCHER_WAIT_FOREVER UINT64_MAX

typedef struct batcher_policy {
    int max_batch;                          /* >= 1 */
    uint64_t max_delay_us;
    int npreferred;
    int preferred[BATCHER_MAX_PREFERRED];   /* each 1..max_batch */
} batcher_policy;

typedef struct batcher_state {
    int queued;             /* images waiting */
    uint64_t oldest_us;     /* enqueue time of the oldest; valid when queued > 0 */
    int flush;              /* draining: do not wait for a fuller batch */
} batcher_state;

typedef struct batcher_decision {
    int send;               /* images to send now; 0 = wait */
    uint64_t wait_us;       /* when send == 0: decide again after this long */
} batcher_decision;

batcher_decision batcher_decide(const batcher_policy *p, const batcher_state *s, uint64_t now_us);

/* Seconds a client refused with 503 should wait: the time to work off
 * `queued` images at `images_per_s`, rounded up, within 1..60. */
int batcher_retry_after_s(long queued, double images_per_s);

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
batcher *batcher_start(struct queue *q, struct infer *inf, const batcher_policy *p,
                       const pipeline_sink *sink, devjpeg *dj, uint64_t max_pixels, char *err, size_t errlen);
/* Joins the thread (call after queue_stop) and frees the batcher. */
void batcher_join(batcher *b);

#endif
