/* Tests daemon/batcher.c's decision function with a fake clock, the
 * Retry-After estimate, and daemon/queue.c's slot accounting and batch
 * popping (deadlines, flush, stop). */
#include <check.h>
#include <stdlib.h>
#include "daemon/batcher.h"
#include "daemon/metrics.h"
#include "daemon/queue.h"
#include "model/clock.h"
#include "model/resnet18.h"
#include "tests/testutil.h"

static batcher_policy policy(int max_batch, uint64_t delay_us)
{
    batcher_policy p = { .max_batch = max_batch, .max_delay_us = delay_us };
    return p;
}

START_TEST(empty_queue_waits_forever)
{
    batcher_policy p = policy(8, 4000);
    batcher_state s = { .queued = 0 };
    batcher_decision d = batcher_decide(&p, &s, 123456);
    ck_assert_int_eq(d.send, 0);
    ck_assert(d.wait_us == BATCHER_WAIT_FOREVER);
}
END_TEST

START_TEST(full_batch_is_sent_at_once)
{
    batcher_policy p = policy(8, 4000);
    batcher_state s = { .queued = 8, .oldest_us = 1000 };
    batcher_decision d = batcher_decide(&p, &s, 1000);
    ck_assert_int_eq(d.send, 8);
    s.queued = 20;   /* more than one batch: still at most max_batch */
    d = batcher_decide(&p, &s, 1000);
    ck_assert_int_eq(d.send, 8);
}
END_TEST

START_TEST(partial_batch_waits_until_oldest_reaches_delay)
{
    batcher_policy p = policy(8, 4000);
    batcher_state s = { .queued = 3, .oldest_us = 10000 };
    uint64_t now = 10000;
    batcher_decision d = batcher_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 4000);
    /* Advance the fake clock by what the batcher was told to wait, less 1. */
    now += 3999;
    d = batcher_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 1);
    now += 1;
    d = batcher_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 3);
}
END_TEST

START_TEST(zero_delay_sends_whatever_is_queued)
{
    batcher_policy p = policy(8, 0);
    batcher_state s = { .queued = 1, .oldest_us = 500 };
    ck_assert_int_eq(batcher_decide(&p, &s, 500).send, 1);
}
END_TEST

START_TEST(clock_before_enqueue_time_is_not_an_underflow)
{
    batcher_policy p = policy(8, 4000);
    batcher_state s = { .queued = 2, .oldest_us = 9000 };
    batcher_decision d = batcher_decide(&p, &s, 8000);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 4000);
}
END_TEST

START_TEST(preferred_size_is_sent_as_soon_as_formed)
{
    batcher_policy p = policy(16, 4000);
    p.npreferred = 2;
    p.preferred[0] = 4;
    p.preferred[1] = 8;
    batcher_state s = { .queued = 3, .oldest_us = 0 };
    ck_assert_int_eq(batcher_decide(&p, &s, 100).send, 0);
    s.queued = 5;
    ck_assert_int_eq(batcher_decide(&p, &s, 100).send, 4);   /* the largest preferred that fits */
    s.queued = 11;
    ck_assert_int_eq(batcher_decide(&p, &s, 100).send, 8);
    s.queued = 3;   /* no preferred size fits: the delay still applies */
    ck_assert_int_eq(batcher_decide(&p, &s, 4000).send, 3);
}
END_TEST

START_TEST(flush_sends_without_waiting)
{
    batcher_policy p = policy(8, 1000000);
    batcher_state s = { .queued = 2, .oldest_us = 100, .flush = 1 };
    ck_assert_int_eq(batcher_decide(&p, &s, 100).send, 2);
    s.queued = 12;
    ck_assert_int_eq(batcher_decide(&p, &s, 100).send, 8);
}
END_TEST

START_TEST(retry_after_tracks_backlog_and_is_bounded)
{
    ck_assert_int_eq(batcher_retry_after_s(100, 0), 1);      /* no estimate yet */
    ck_assert_int_eq(batcher_retry_after_s(0, 50), 1);
    ck_assert_int_eq(batcher_retry_after_s(100, 50), 2);
    ck_assert_int_eq(batcher_retry_after_s(101, 50), 3);     /* rounded up */
    ck_assert_int_eq(batcher_retry_after_s(100000, 1), 60);
}
END_TEST

/* ---- the queue -------------------------------------------------------- */

START_TEST(reserve_is_all_or_nothing_and_release_restores)
{
    char err[256];
    queue *q = queue_create(4, err, sizeof err);
    ck_assert_msg(q != NULL, "%s", err);
    int slots[4], more[4];
    ck_assert_int_eq(queue_reserve(q, 3, slots), 0);
    ck_assert_int_eq(queue_reserve(q, 2, more), -1);          /* only 1 left */
    ck_assert_int_eq(queue_reserve(q, 1, more), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_ne(slots[i], more[0]);
    ck_assert_int_eq(queue_reserve(q, 1, more + 1), -1);
    queue_release(q, slots, 3);
    ck_assert_int_eq(queue_reserve(q, 3, slots), 0);
    /* Slot buffers are distinct and writable. */
    for (int i = 0; i < 3; i++)
        queue_slot(q, slots[i])[RESNET18_INPUT_BYTES - 1] = (uint8_t)i;
    queue_destroy(q);
}
END_TEST

static queue_item item(int image, int slot, uint64_t enq, uint64_t deadline)
{
    queue_item it = { .req = NULL, .image = image, .slot = slot, .fd = -1,
                      .enqueued_us = enq, .deadline_us = deadline };
    return it;
}

START_TEST(pop_returns_fifo_batches_of_at_most_max)
{
    char err[256];
    queue *q = queue_create(16, err, sizeof err);
    ck_assert_ptr_nonnull(q);
    int slots[10];
    ck_assert_int_eq(queue_reserve(q, 10, slots), 0);
    uint64_t now = clock_now_us();
    queue_item items[10];
    for (int i = 0; i < 10; i++)
        items[i] = item(i, slots[i], now, now + 60000000u);
    queue_push(q, items, 10);
    ck_assert_int_eq(queue_depth(q), 10);
    batcher_policy p = policy(4, 1000000);
    queue_item batch[4], expired[4];
    int n, nexp;
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 4, &nexp), 0);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(nexp, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(batch[i].image, i);
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 4, &nexp), 0);
    ck_assert_int_eq(batch[0].image, 4);
    ck_assert_int_eq(queue_depth(q), 2);
    /* Two left, far below the 1 s delay: flush sends them without waiting. */
    queue_set_flush(q, 1);
    uint64_t t0 = clock_now_us();
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 4, &nexp), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_lt(clock_now_us() - t0, 500000);
    queue_stop(q);
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 4, &nexp), -1);
    queue_destroy(q);
}
END_TEST

START_TEST(pop_waits_for_max_delay_then_sends_partial)
{
    char err[256];
    queue *q = queue_create(8, err, sizeof err);
    ck_assert_ptr_nonnull(q);
    int slot;
    ck_assert_int_eq(queue_reserve(q, 1, &slot), 0);
    uint64_t now = clock_now_us();
    queue_item it = item(0, slot, now, now + 60000000u);
    queue_push(q, &it, 1);
    batcher_policy p = policy(8, 50000);
    queue_item batch[8], expired[4];
    int n, nexp;
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 4, &nexp), 0);
    uint64_t waited = clock_now_us() - now;
    ck_assert_int_eq(n, 1);
    ck_assert_msg(waited >= 50000, "sent after %llu us, before the 50 ms delay", (unsigned long long)waited);
    queue_destroy(q);
}
END_TEST

START_TEST(expired_items_come_back_separately)
{
    char err[256];
    queue *q = queue_create(8, err, sizeof err);
    ck_assert_ptr_nonnull(q);
    int slots[3];
    ck_assert_int_eq(queue_reserve(q, 3, slots), 0);
    uint64_t now = clock_now_us();
    queue_item items[3] = {
        item(0, slots[0], now - 2000, now - 1000),     /* already past its deadline */
        item(1, slots[1], now - 1500, now - 500),
        item(2, slots[2], now, now + 60000000u),
    };
    queue_push(q, items, 3);
    batcher_policy p = policy(8, 1000000);
    queue_item batch[8], expired[8];
    int n, nexp;
    ck_assert_int_eq(queue_pop_batch(q, &p, batch, &n, expired, 8, &nexp), 0);
    ck_assert_int_eq(nexp, 2);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(expired[0].image, 0);
    ck_assert_int_eq(expired[1].image, 1);
    ck_assert_int_eq(queue_depth(q), 1);
    ck_assert_int_eq(queue_take_all(q, batch, 8), 1);
    ck_assert_int_eq(batch[0].image, 2);
    ck_assert_int_eq(queue_depth(q), 0);
    queue_destroy(q);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("batcher");
    TCase *tc = tcase_create("decide");
    tcase_add_test(tc, empty_queue_waits_forever);
    tcase_add_test(tc, full_batch_is_sent_at_once);
    tcase_add_test(tc, partial_batch_waits_until_oldest_reaches_delay);
    tcase_add_test(tc, zero_delay_sends_whatever_is_queued);
    tcase_add_test(tc, clock_before_enqueue_time_is_not_an_underflow);
    tcase_add_test(tc, preferred_size_is_sent_as_soon_as_formed);
    tcase_add_test(tc, flush_sends_without_waiting);
    tcase_add_test(tc, retry_after_tracks_backlog_and_is_bounded);
    suite_add_tcase(s, tc);
    TCase *tq = tcase_create("queue");
    tcase_add_test(tq, reserve_is_all_or_nothing_and_release_restores);
    tcase_add_test(tq, pop_returns_fifo_batches_of_at_most_max);
    tcase_add_test(tq, pop_waits_for_max_delay_then_sends_partial);
    tcase_add_test(tq, expired_items_come_back_separately);
    suite_add_tcase(s, tq);
    return s;
}

int main(void)
{
    metrics_init("test", "cpu", "fp32");
    return testutil_run(suite());
}
