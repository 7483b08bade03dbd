/* The batch policy: the pure decision the batcher runs on the queue's
 * lock (state, now -> send N now | wait T us), which tests drive with a
 * fake clock, and the Retry-After a full queue gives.
 *
 * As Triton's dynamic batcher: a full batch goes at once; a preferred size
 * goes as soon as it can be formed; otherwise the batcher waits until the
 * oldest image has waited max_delay_us, then sends what is there. While
 * draining it sends at once. */
#ifndef RESNETD_BATCH_POLICY_H
#define RESNETD_BATCH_POLICY_H

#include <stdint.h>

#define BATCH_MAX_PREFERRED 16
#define BATCH_WAIT_FOREVER UINT64_MAX

typedef struct batch_policy {
    int max_batch; /* >= 1 */
    uint64_t max_delay_us;
    int npreferred;
    int preferred[BATCH_MAX_PREFERRED]; /* each 1..max_batch */
} batch_policy;

typedef struct batch_state {
    int queued; /* images waiting */
    uint64_t oldest_us; /* enqueue time of the oldest; valid when queued > 0 */
    int flush; /* draining: do not wait for a fuller batch */
} batch_state;

typedef struct batch_decision {
    int send; /* images to send now; 0 = wait */
    uint64_t wait_us; /* when send == 0: decide again after this long */
} batch_decision;

batch_decision batch_decide(const batch_policy *p, const batch_state *s, uint64_t now_us);

/* Seconds a client refused with 503 should wait: the time to work off
 * `queued` images at `images_per_s`, rounded up, within 1..60. */
int batch_retry_after_s(long queued, double images_per_s);

#endif
