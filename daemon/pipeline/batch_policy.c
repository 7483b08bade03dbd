/* The batch policy (daemon/pipeline/batch_policy.h): pure functions, no state. */
#include <math.h>
#include "daemon/pipeline/batch_policy.h"

batch_decision batch_decide(const batch_policy *p, const batch_state *s, uint64_t now_us)
{
    batch_decision d = { 0, BATCH_WAIT_FOREVER };
    if (s->queued <= 0)
        return d;
    if (s->queued >= p->max_batch) {
        d.send = p->max_batch;
        return d;
    }
    if (s->flush) {
        d.send = s->queued;
        return d;
    }
    int best = 0;
    for (int i = 0; i < p->npreferred; i++)
        if (p->preferred[i] <= s->queued && p->preferred[i] > best)
            best = p->preferred[i];
    if (best > 0) {
        d.send = best;
        return d;
    }
    uint64_t age = now_us > s->oldest_us ? now_us - s->oldest_us : 0;
    if (age >= p->max_delay_us) {
        d.send = s->queued;
        return d;
    }
    d.wait_us = p->max_delay_us - age;
    return d;
}

int batch_retry_after_s(long queued, double images_per_s)
{
    if (!(images_per_s > 0) || queued <= 0)
        return 1;
    double s = ceil((double)queued / images_per_s);
    return s < 1 ? 1 : s > 60 ? 60 : (int)s;
}
