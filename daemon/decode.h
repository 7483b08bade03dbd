/* JPEG decoding on the HTTP worker threads, straight into a queue slot.
 * Each worker thread lazily gets its own preprocess context (TurboJPEG
 * handle and scratch that grows to the largest image, then is reused); it
 * is destroyed when the thread exits. */
#ifndef RESNETD_DECODE_H
#define RESNETD_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include "model/preprocess.h"

/* Once at start-up. */
int decode_init(uint64_t max_pixels, char *err, size_t errlen);

/* Decodes and crops one JPEG into out (RESNET18_INPUT_BYTES). */
preprocess_status decode_jpeg(const uint8_t *jpeg, size_t len, uint8_t *out, char *err, size_t errlen);

/* The HTTP status for a decode failure: 400 corrupt/empty, 413 too many
 * pixels, 415 not a JPEG or an unsupported one, 500 out of memory. */
int decode_http_status(preprocess_status s);

/* Frees the calling thread's context (the others go with their threads). */
void decode_thread_done(void);

#endif
