/* A log-linear latency histogram in the manner of HdrHistogram: values below
 * 2^HISTOGRAM_SUB_BITS are counted exactly; above, each power-of-two range is
 * split into HISTOGRAM_HALF = 2^(HISTOGRAM_SUB_BITS - 1) equal buckets, so a
 * bucket is at most 1/128 of its lower bound wide and a reported value (the
 * bucket's midpoint, clamped to the exact min and max) is within 0.4% of the
 * recorded one.
 * Fixed size (no allocation), covers all of uint64_t; one per thread, merged
 * at the end. Not thread-safe. */
#ifndef RESNETD_HISTOGRAM_H
#define RESNETD_HISTOGRAM_H

#include <stdint.h>

#define HISTOGRAM_SUB_BITS 8
#define HISTOGRAM_HALF (1u << (HISTOGRAM_SUB_BITS - 1))
/* 2^8 exact values, then 128 buckets for each octave [2^e, 2^(e+1)), e = 8..63:
 * 7424 buckets, 58 KiB. */
#define HISTOGRAM_BUCKETS ((1u << HISTOGRAM_SUB_BITS) + (64u - HISTOGRAM_SUB_BITS) * HISTOGRAM_HALF)

typedef struct {
    uint64_t counts[HISTOGRAM_BUCKETS];
    uint64_t total;
    uint64_t min, max;
    double sum; /* for the mean */
} histogram;

void histogram_init(histogram *h);
void histogram_record(histogram *h, uint64_t v);
void histogram_merge(histogram *dst, const histogram *src);

/* The value at quantile q in [0, 1] (q = 0.5 is the median): the smallest
 * recorded value v with at least ceil(q * total) values <= v, to within the
 * bucket's precision. 0 when empty. */
uint64_t histogram_quantile(const histogram *h, double q);
double histogram_mean(const histogram *h);

/* Exposed for the tests: a value's bucket and a bucket's [lo, hi] range. */
unsigned histogram_bucket(uint64_t v);
void histogram_bucket_range(unsigned b, uint64_t *lo, uint64_t *hi);

#endif
