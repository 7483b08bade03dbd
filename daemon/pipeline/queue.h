/* The bounded queue between the HTTP workers and the batcher.
 *
 * It owns `capacity` preallocated image slots (224x224x3 uint8 each, HWC)
 * so a request decodes straight into a slot and nothing image-sized is
 * allocated per request. A request reserves all its slots at once (or gets
 * 503), decodes into them, then pushes one item per image; the batcher pops
 * items in FIFO order and releases each slot once its image has been copied
 * into an engine slot. Thread-safe; one mutex, held only briefly. */
#ifndef RESNETD_QUEUE_H
#define RESNETD_QUEUE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/pipeline/batch_policy.h"
#include "daemon/pipeline/pipeline.h"

typedef struct queue queue;

queue *queue_create(int capacity, char *err, size_t errlen);
void queue_destroy(queue *q);

int queue_capacity(const queue *q);
uint8_t *queue_slot(queue *q, int slot);

/* Reserves n free slots into slots[], all or none: 0, or -1 when fewer than
 * n are free (the caller answers 503). */
int queue_reserve(queue *q, int n, int *slots);
void queue_release(queue *q, const int *slots, int n);

/* Appends items (whose slots are reserved and filled) and wakes the batcher. */
void queue_push(queue *q, const queue_item *items, int n);

/* Images pushed and not yet popped. */
int queue_depth(queue *q);
/* Pixels of the still-compressed images among them and of those being
 * staged: the device decoders' backlog. */
uint64_t queue_jpeg_pixels(queue *q);
/* A device decoder's stage of px compressed pixels begins (begin 1) or
 * ends (0). The stage holds a decoder for as long as a whole batch takes
 * (~180 ms for 128 photos of 12 MP): a backlog without it looked short
 * enough that the decode threads left large photos to the GPU while idle. */
void queue_staging(queue *q, uint64_t px, int begin);

/* Blocks until batch_decide() says send, or until some queued images have
 * passed their deadline. Fills batch[0..*nbatch) (at most p->max_batch) and
 * expired[0..*nexpired) (at most max_expired); either may be empty. Returns
 * -1 once the queue is stopped and empty, else 0. */
int queue_pop_batch(queue *q, const batch_policy *p, queue_item *batch, int *nbatch, queue_item *expired,
                    int max_expired, int *nexpired);

/* Draining: batches go out at once instead of waiting for max delay. */
void queue_set_flush(queue *q, int on);

/* Removes up to max queued items into out (to fail them at shutdown). */
int queue_take_all(queue *q, queue_item *out, int max);

/* queue_pop_batch returns -1 once the queue is empty. */
void queue_stop(queue *q);

#endif
