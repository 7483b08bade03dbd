/* Log-linear histogram: bucket arithmetic and quantiles (see histogram.h). */
#include <string.h>
#include "client/histogram.h"

void histogram_init(histogram *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

unsigned histogram_bucket(uint64_t v)
{
    if (v < (1u << HISTOGRAM_SUB_BITS))
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* v in [2^e, 2^(e+1)) */
    unsigned shift = e - (HISTOGRAM_SUB_BITS - 1);
    unsigned sub = (unsigned)(v >> shift) - HISTOGRAM_HALF; /* 0 .. HALF-1 */
    return (1u << HISTOGRAM_SUB_BITS) + (e - HISTOGRAM_SUB_BITS) * HISTOGRAM_HALF + sub;
}

void histogram_bucket_range(unsigned b, uint64_t *lo, uint64_t *hi)
{
    if (b < (1u << HISTOGRAM_SUB_BITS)) {
        *lo = *hi = b;
        return;
    }
    unsigned k = b - (1u << HISTOGRAM_SUB_BITS);
    unsigned e = HISTOGRAM_SUB_BITS + k / HISTOGRAM_HALF;
    unsigned shift = e - (HISTOGRAM_SUB_BITS - 1);
    uint64_t sub = HISTOGRAM_HALF + k % HISTOGRAM_HALF;
    *lo = sub << shift;
    *hi = *lo + ((1ull << shift) - 1);
}

void histogram_record(histogram *h, uint64_t v)
{
    h->counts[histogram_bucket(v)]++;
    h->total++;
    h->sum += (double)v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

void histogram_merge(histogram *dst, const histogram *src)
{
    for (unsigned i = 0; i < HISTOGRAM_BUCKETS; i++)
        dst->counts[i] += src->counts[i];
    dst->total += src->total;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t histogram_quantile(const histogram *h, double q)
{
    if (h->total == 0)
        return 0;
    if (q <= 0)
        return h->min;
    if (q >= 1)
        return h->max;
    /* rank = ceil(q * total), at least 1; the bucket holding that rank */
    double r = q * (double)h->total;
    uint64_t rank = (uint64_t)r;
    if ((double)rank < r)
        rank++;
    if (rank <= 1)
        return h->min;
    if (rank >= h->total)
        return h->max; /* the extremes are known exactly */
    uint64_t seen = 0;
    for (unsigned b = 0; b < HISTOGRAM_BUCKETS; b++) {
        seen += h->counts[b];
        if (seen >= rank) {
            uint64_t lo, hi;
            histogram_bucket_range(b, &lo, &hi);
            uint64_t mid = lo + (hi - lo) / 2;
            if (mid < h->min)
                mid = h->min;
            if (mid > h->max)
                mid = h->max;
            return mid;
        }
    }
    return h->max;
}

double histogram_mean(const histogram *h)
{
    return h->total ? h->sum / (double)h->total : 0.0;
}
