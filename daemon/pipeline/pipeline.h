/* What travels down the request path: request -> decode -> queue ->
 * batcher -> infer -> response. A queue_item is one decoded image waiting
 * in a preallocated slot; the pipeline reports each image's outcome back to
 * the request's owner (the HTTP server) through a pipeline_sink, so the
 * queue, batcher and infer modules never see the HTTP layer. */
#ifndef RESNETD_PIPELINE_H
#define RESNETD_PIPELINE_H

#include <stdint.h>

typedef struct queue_item {
    void *req; /* the owner's request; opaque here; NULL: skip */
    int image; /* index of the image within its request */
    int slot; /* queue slot holding the decoded 224x224x3 crop */
    /* For the device decoder: the still-compressed JPEG (owned by the
     * request, alive until it is answered) and its size; jpeg == NULL when
     * the crop is in the slot. */
    const uint8_t *jpeg;
    size_t jpeg_len;
    /* An image that came as a normalised FP32 tensor ([3][224][224], owned
     * by the request like jpeg): the engine reads it instead of the slot,
     * which is reserved but unused. NULL for pixels. */
    const float *f32;
    int w, h;
    int fd; /* client socket, polled for disconnects; -1 = none */
    uint64_t enqueued_us; /* clock_now_us() when queued */
    uint64_t deadline_us; /* past this it is answered 504 */
} queue_item;

typedef struct pipeline_timing {
    uint64_t queue_us; /* enqueue -> batch start */
    uint64_t gpu_decode_us; /* the batch's device decode stage; 0: decoded on the CPU */
    uint64_t infer_us; /* submit -> logits */
    int batch_size;
} pipeline_timing;

struct served_model;

/* Called from the batcher or completion thread, once per image. The
 * request stays alive until every one of its images has been reported. */
typedef struct pipeline_sink {
    /* logits[classes] (the engine's class count) are valid only during the
     * call; model is what computed them (daemon/pipeline/served_model.h), for the sink to
     * reference. */
    void (*done)(void *req, int image, const float *logits, int classes, struct served_model *model,
                 const pipeline_timing *t);
    void (*fail)(void *req, int image, int status, const char *code, const char *message);
} pipeline_sink;

#endif
