/* Batch invariance, the property every engine path promises (protocol/API.md):
 * an image's logits are the same bits at any position of any batch size.
 * Shared by the engine tests (CPU FP32, CPU INT8, CUDA). */
#ifndef RESNETD_TEST_INVARIANCE_H
#define RESNETD_TEST_INVARIANCE_H

#include <stdint.h>
#include "engine/engine.h"

/* images: nimages >= 3 uint8 224x224x3 images; the first two are probes,
 * the rest fill the other positions. Each probe's logits alone (batch 1)
 * are the reference. Then for every batch size in sizes (each 1..max_batch),
 * three batches: positions i with (i + r) % 3 == 0 get probe 0, == 1 probe
 * 1, == 2 a filler (r = 0, 1, 2), so each probe sits at every position of
 * every size once; batches rotate through the slots. Every probe's logits
 * are compared with its reference bit for bit (memcmp; a NaN poisons the
 * output first, so a position left unwritten differs). must_hold: the
 * first difference fails the Check test, naming `what`, the size and the
 * position; else differences are only counted. Prints a summary line and
 * returns the count of probe placements that differed. */
int invariance_check(engine *e, const uint8_t *images, int nimages, const int *sizes, int nsizes, const char *what,
                     int must_hold);

/* sizes 1..max into out (max entries). */
int invariance_all_sizes(int max, int *out);

#endif
