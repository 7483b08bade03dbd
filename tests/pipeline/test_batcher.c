/* Tests daemon/pipeline/batcher.c's decision function with a fake clock, the
 * Retry-After estimate, daemon/pipeline/queue.c's slot accounting and batch popping
 * (deadlines, flush, stop), and the whole batcher -> infer pipeline on a
 * fake engine: two batches in flight, every image reported exactly once,
 * engine failures reported as 500 and reflected in health. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>
#include "daemon/pipeline/batcher.h"
#include "daemon/pipeline/infer.h"
#include "daemon/api/metrics.h"
#include "daemon/pipeline/queue.h"
#include "util/clock.h"
#include "model/resnet18.h"
#include "tests/lib/testutil.h"

static batch_policy policy(int max_batch, uint64_t delay_us)
{
    batch_policy p = { .max_batch = max_batch, .max_delay_us = delay_us };
    return p;
}

START_TEST(empty_queue_waits_forever)
{
    batch_policy p = policy(8, 4000);
    batch_state s = { .queued = 0 };
    batch_decision d = batch_decide(&p, &s, 123456);
    ck_assert_int_eq(d.send, 0);
    ck_assert(d.wait_us == BATCH_WAIT_FOREVER);
}
END_TEST

START_TEST(full_batch_is_sent_at_once)
{
    batch_policy p = policy(8, 4000);
    batch_state s = { .queued = 8, .oldest_us = 1000 };
    batch_decision d = batch_decide(&p, &s, 1000);
    ck_assert_int_eq(d.send, 8);
    s.queued = 20; /* more than one batch: still at most max_batch */
    d = batch_decide(&p, &s, 1000);
    ck_assert_int_eq(d.send, 8);
}
END_TEST

START_TEST(partial_batch_waits_until_oldest_reaches_delay)
{
    batch_policy p = policy(8, 4000);
    batch_state s = { .queued = 3, .oldest_us = 10000 };
    uint64_t now = 10000;
    batch_decision d = batch_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 4000);
    /* Advance the fake clock by what the batcher was told to wait, less 1. */
    now += 3999;
    d = batch_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 1);
    now += 1;
    d = batch_decide(&p, &s, now);
    ck_assert_int_eq(d.send, 3);
}
END_TEST

START_TEST(zero_delay_sends_whatever_is_queued)
{
    batch_policy p = policy(8, 0);
    batch_state s = { .queued = 1, .oldest_us = 500 };
    ck_assert_int_eq(batch_decide(&p, &s, 500).send, 1);
}
END_TEST

START_TEST(clock_before_enqueue_time_is_not_an_underflow)
{
    batch_policy p = policy(8, 4000);
    batch_state s = { .queued = 2, .oldest_us = 9000 };
    batch_decision d = batch_decide(&p, &s, 8000);
    ck_assert_int_eq(d.send, 0);
    ck_assert_uint_eq(d.wait_us, 4000);
}
END_TEST

START_TEST(preferred_size_is_sent_as_soon_as_formed)
{
    batch_policy p = policy(16, 4000);
    p.npreferred = 2;
    p.preferred[0] = 4;
    p.preferred[1] = 8;
    batch_state s = { .queued = 3, .oldest_us = 0 };
    ck_assert_int_eq(batch_decide(&p, &s, 100).send, 0);
    s.queued = 5;
    ck_assert_int_eq(batch_decide(&p, &s, 100).send, 4); /* the largest preferred that fits */
    s.queued = 11;
    ck_assert_int_eq(batch_decide(&p, &s, 100).send, 8);
    s.queued = 3; /* no preferred size fits: the delay still applies */
    ck_assert_int_eq(batch_decide(&p, &s, 4000).send, 3);
}
END_TEST

START_TEST(flush_sends_without_waiting)
{
    batch_policy p = policy(8, 1000000);
    batch_state s = { .queued = 2, .oldest_us = 100, .flush = 1 };
    ck_assert_int_eq(batch_decide(&p, &s, 100).send, 2);
    s.queued = 12;
    ck_assert_int_eq(batch_decide(&p, &s, 100).send, 8);
}
END_TEST

START_TEST(retry_after_tracks_backlog_and_is_bounded)
{
    ck_assert_int_eq(batch_retry_after_s(100, 0), 1); /* no estimate yet */
    ck_assert_int_eq(batch_retry_after_s(0, 50), 1);
    ck_assert_int_eq(batch_retry_after_s(100, 50), 2);
    ck_assert_int_eq(batch_retry_after_s(101, 50), 3); /* rounded up */
    ck_assert_int_eq(batch_retry_after_s(100000, 1), 60);
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
    ck_assert_int_eq(queue_reserve(q, 2, more), -1); /* only 1 left */
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
    queue_item it = {
        .req = NULL, .image = image, .slot = slot, .fd = -1, .enqueued_us = enq, .deadline_us = deadline
    };
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
    batch_policy p = policy(4, 1000000);
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
    batch_policy p = policy(8, 50000);
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
        item(0, slots[0], now - 2000, now - 1000), /* already past its deadline */
        item(1, slots[1], now - 1500, now - 500),
        item(2, slots[2], now, now + 60000000u),
    };
    queue_push(q, items, 3);
    batch_policy p = policy(8, 1000000);
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

/* ---- the pipeline on a fake engine ------------------------------------- */

/* Not ImageNet's 1000: the pipeline must take the count from the engine. */
#define FAKE_CLASSES 7

typedef struct fake_engine {
    atomic_int in_flight, max_in_flight, fail_next, batches;
    engine *e;
} fake_engine;

static int fake_submit(void *ctx, int slot, int n, char *err, size_t errlen)
{
    fake_engine *f = ctx;
    if (atomic_exchange(&f->fail_next, 0)) {
        snprintf(err, errlen, "fake engine: injected failure");
        return -1;
    }
    /* "Logits": image i's first pixel (or first value, for an FP32 image),
     * so a test can see which image ran. */
    for (int i = 0; i < n; i++)
        f->e->logits[slot][(size_t)i * FAKE_CLASSES] = f->e->input_f32[slot][i]
                                                           ? f->e->input_f32[slot][i][0]
                                                           : f->e->input[slot][(size_t)i * RESNET18_INPUT_BYTES];
    int now = atomic_fetch_add(&f->in_flight, 1) + 1;
    int max = atomic_load(&f->max_in_flight);
    while (now > max && !atomic_compare_exchange_weak(&f->max_in_flight, &max, now))
        ;
    atomic_fetch_add(&f->batches, 1);
    return 0;
}

static int fake_wait(void *ctx, int slot, char *err, size_t errlen)
{
    (void)slot;
    (void)err;
    (void)errlen;
    fake_engine *f = ctx;
    struct timespec ts = { 0, 20 * 1000 * 1000 }; /* "compute" */
    nanosleep(&ts, NULL);
    atomic_fetch_sub(&f->in_flight, 1);
    return 0;
}

static void fake_destroy(void *ctx)
{
    (void)ctx;
}

static const engine_ops fake_ops = {
    .name = "fake", .submit = fake_submit, .wait = fake_wait, .destroy = fake_destroy
};

static engine *fake_engine_create(fake_engine *f, int nslots, int max_batch)
{
    engine *e = calloc(1, sizeof *e);
    e->ops = &fake_ops;
    e->ctx = f;
    e->device = ENGINE_DEVICE_CPU;
    e->precision = ENGINE_PRECISION_FP32;
    e->max_batch = max_batch;
    e->nslots = nslots;
    e->classes = FAKE_CLASSES;
    for (int s = 0; s < nslots; s++) {
        e->input[s] = calloc((size_t)max_batch, RESNET18_INPUT_BYTES);
        e->input_f32[s] = calloc((size_t)max_batch, sizeof *e->input_f32[s]);
        e->logits[s] = calloc((size_t)max_batch * FAKE_CLASSES, sizeof(float));
    }
    f->e = e;
    return e;
}

static void fake_engine_free(engine *e)
{
    for (int s = 0; s < e->nslots; s++) {
        free(e->input[s]);
        free(e->input_f32[s]);
        free(e->logits[s]);
    }
    free(e);
}

#define NIMAGES 40
static atomic_int done_count[NIMAGES], fail_count[NIMAGES], wrong_pixels, max_batch_seen, fail_status;
static served_model *_Atomic done_model[NIMAGES];

static void sink_done(void *req, int image, const float *logits, int classes, served_model *model,
                      const pipeline_timing *t)
{
    (void)image;
    int id = (int)(intptr_t)req - 1;
    atomic_store(&done_model[id], model);
    atomic_fetch_add(&done_count[id], 1);
    if (classes != FAKE_CLASSES || (int)logits[0] != id)
        atomic_fetch_add(&wrong_pixels, 1);
    int m = atomic_load(&max_batch_seen);
    while (t->batch_size > m && !atomic_compare_exchange_weak(&max_batch_seen, &m, t->batch_size))
        ;
}

static void sink_fail(void *req, int image, int status, const char *code, const char *message)
{
    (void)image;
    (void)code;
    (void)message;
    atomic_fetch_add(&fail_count[(int)(intptr_t)req - 1], 1);
    atomic_store(&fail_status, status);
}

static const pipeline_sink test_sink = { .done = sink_done, .fail = sink_fail };

static void reset_counts(void)
{
    for (int i = 0; i < NIMAGES; i++) {
        atomic_store(&done_count[i], 0);
        atomic_store(&fail_count[i], 0);
    }
    atomic_store(&wrong_pixels, 0);
    atomic_store(&max_batch_seen, 0);
    atomic_store(&fail_status, 0);
}

/* "FP32 tensors" whose first value is their image's id. */
static float f32_images[NIMAGES];

/* Images first..first+n; every third comes as an FP32 tensor (v2's "input"),
 * its queue slot filled with a wrong id, so only the tensor gives its id. */
static void push_images(queue *q, int first, int n)
{
    for (int id = first; id < first + n; id++) {
        int slot;
        ck_assert_int_eq(queue_reserve(q, 1, &slot), 0);
        int as_f32 = id % 3 == 2;
        memset(queue_slot(q, slot), as_f32 ? 0xee : id, RESNET18_INPUT_BYTES);
        f32_images[id] = (float)id;
        uint64_t now = clock_now_us();
        queue_item it = { .req = (void *)(intptr_t)(id + 1),
                          .image = 0,
                          .slot = slot,
                          .fd = -1,
                          .f32 = as_f32 ? &f32_images[id] : NULL,
                          .enqueued_us = now,
                          .deadline_us = now + 60000000u };
        queue_push(q, &it, 1);
    }
}

static int reported(int n)
{
    int total = 0;
    for (int i = 0; i < n; i++)
        total += atomic_load(&done_count[i]) + atomic_load(&fail_count[i]);
    return total;
}

static void wait_reported(int n)
{
    for (int i = 0; i < 1000 && reported(n) < n; i++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
}

START_TEST(pipeline_keeps_two_batches_in_flight_and_reports_each_image_once)
{
    reset_counts();
    fake_engine f = { 0 };
    engine *e = fake_engine_create(&f, 2, 4);
    char err[256];
    queue *q = queue_create(64, err, sizeof err);
    infer *inf = infer_create(e, NULL, NULL, NULL, &test_sink, err, sizeof err);
    ck_assert_ptr_nonnull(q);
    ck_assert_ptr_nonnull(inf);
    batch_policy p = policy(4, 1000);
    batcher *b = batcher_start(q, inf, &p, &test_sink, NULL, 0, err, sizeof err);
    ck_assert_ptr_nonnull(b);
    push_images(q, 0, NIMAGES);
    wait_reported(NIMAGES);
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    for (int i = 0; i < NIMAGES; i++) {
        ck_assert_int_eq(atomic_load(&done_count[i]), 1);
        ck_assert_int_eq(atomic_load(&fail_count[i]), 0);
    }
    ck_assert_int_eq(atomic_load(&wrong_pixels), 0); /* each image's own pixels reached the engine */
    ck_assert_int_eq(atomic_load(&max_batch_seen), 4);
    ck_assert_int_ge(atomic_load(&f.batches), NIMAGES / 4);
    /* While the completion thread waited on one slot, the batcher had
     * already submitted the other. */
    ck_assert_int_eq(atomic_load(&f.max_in_flight), 2);
    ck_assert_int_eq(infer_healthy(inf), 1);
    ck_assert(infer_images_per_s(inf) > 0);
    infer_destroy(inf);
    queue_destroy(q);
    fake_engine_free(e);
}
END_TEST

START_TEST(engine_failure_fails_its_batch_with_500_until_a_batch_succeeds)
{
    reset_counts();
    fake_engine f = { 0 };
    engine *e = fake_engine_create(&f, 1, 4);
    char err[256];
    queue *q = queue_create(16, err, sizeof err);
    infer *inf = infer_create(e, NULL, NULL, NULL, &test_sink, err, sizeof err);
    batch_policy p = policy(4, 0);
    batcher *b = batcher_start(q, inf, &p, &test_sink, NULL, 0, err, sizeof err);
    ck_assert_ptr_nonnull(b);
    atomic_store(&f.fail_next, 1);
    push_images(q, 0, 1);
    wait_reported(1);
    ck_assert_int_eq(atomic_load(&fail_count[0]), 1);
    ck_assert_int_eq(atomic_load(&fail_status), 500);
    ck_assert_int_eq(infer_healthy(inf), 0);
    push_images(q, 1, 1);
    wait_reported(2);
    ck_assert_int_eq(atomic_load(&done_count[1]), 1);
    ck_assert_int_eq(infer_healthy(inf), 1);
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    infer_destroy(inf);
    queue_destroy(q);
    fake_engine_free(e);
}
END_TEST

/* Hot reload: infer_swap between batches while images keep coming. Every
 * image is reported once, with its own pixels, by the model of the engine
 * that ran it: the old one before the swap returned, the new one for
 * everything queued after. */
START_TEST(swap_moves_batches_to_the_new_engine_without_losing_any)
{
    reset_counts();
    fake_engine fa = { 0 }, fb = { 0 }, fc = { 0 };
    engine *a = fake_engine_create(&fa, 2, 4), *b2 = fake_engine_create(&fb, 2, 4);
    engine *odd = fake_engine_create(&fc, 2, 8);
    served_model ma = { .version = 1 }, mb = { .version = 2 };
    atomic_init(&ma.refs, 1);
    atomic_init(&mb.refs, 1);
    char err[256];
    queue *q = queue_create(64, err, sizeof err);
    infer *inf = infer_create(a, &ma, NULL, NULL, &test_sink, err, sizeof err);
    batch_policy p = policy(4, 1000);
    batcher *b = batcher_start(q, inf, &p, &test_sink, NULL, 0, err, sizeof err);
    ck_assert_ptr_nonnull(b);
    push_images(q, 0, NIMAGES / 2);
    wait_reported(4);
    engine *old = NULL;
    /* A different max batch is refused and changes nothing. */
    ck_assert_int_eq(infer_swap(inf, odd, &mb, &old, err, sizeof err), -1);
    ck_assert_ptr_null(old);
    ck_assert_int_eq(infer_swap(inf, b2, &mb, &old, err, sizeof err), 0);
    ck_assert_ptr_eq(old, a);
    ck_assert_ptr_eq(infer_engine(inf), b2);
    push_images(q, NIMAGES / 2, NIMAGES / 2);
    wait_reported(NIMAGES);
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    for (int i = 0; i < NIMAGES; i++) {
        ck_assert_int_eq(atomic_load(&done_count[i]) + atomic_load(&fail_count[i]), 1);
        ck_assert_int_eq(atomic_load(&done_count[i]), 1);
        if (i < 4)
            ck_assert_ptr_eq(atomic_load(&done_model[i]), &ma);
        else if (i >= NIMAGES / 2)
            ck_assert_ptr_eq(atomic_load(&done_model[i]), &mb);
        else
            ck_assert(atomic_load(&done_model[i]) == &ma || atomic_load(&done_model[i]) == &mb);
    }
    ck_assert_int_eq(atomic_load(&wrong_pixels), 0);
    ck_assert_int_ge(atomic_load(&fa.batches), 1);
    ck_assert_int_ge(atomic_load(&fb.batches), NIMAGES / 2 / 4);
    ck_assert_int_eq(atomic_load(&fc.batches), 0);
    served_model *m = infer_model(inf);
    ck_assert_ptr_eq(m, &mb);
    served_model_unref(m);
    infer_destroy(inf);
    /* infer's references are gone: only the test's own are left. */
    ck_assert_int_eq(atomic_load(&ma.refs), 1);
    ck_assert_int_eq(atomic_load(&mb.refs), 1);
    queue_destroy(q);
    fake_engine_free(a);
    fake_engine_free(b2);
    fake_engine_free(odd);
}
END_TEST

/* Several engines (device = cuda:all): a pipeline and batcher each, one
 * shared queue. Every image is reported once with its own pixels, and the
 * engines share the work (the slower one takes fewer batches). */
START_TEST(engines_share_one_queue)
{
    reset_counts();
    fake_engine fa = { 0 }, fb = { 0 };
    engine *a = fake_engine_create(&fa, 2, 4), *b2 = fake_engine_create(&fb, 2, 4);
    char err[256];
    queue *q = queue_create(64, err, sizeof err);
    infer *ia = infer_create(a, NULL, NULL, NULL, &test_sink, err, sizeof err);
    infer *ib = infer_create(b2, NULL, NULL, NULL, &test_sink, err, sizeof err);
    batch_policy p = policy(4, 1000);
    batcher *ba = batcher_start(q, ia, &p, &test_sink, NULL, 0, err, sizeof err);
    batcher *bb = batcher_start(q, ib, &p, &test_sink, NULL, 0, err, sizeof err);
    ck_assert(ia && ib && ba && bb);
    for (int i = 0; i < NIMAGES; i += 4) {
        push_images(q, i, 4);
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    wait_reported(NIMAGES);
    queue_stop(q);
    batcher_join(ba);
    batcher_join(bb);
    infer_stop(ia);
    infer_stop(ib);
    for (int i = 0; i < NIMAGES; i++)
        ck_assert_int_eq(atomic_load(&done_count[i]), 1);
    ck_assert_int_eq(atomic_load(&wrong_pixels), 0);
    ck_assert_int_ge(atomic_load(&fa.batches), 2);
    ck_assert_int_ge(atomic_load(&fb.batches), 2);
    infer_destroy(ia);
    infer_destroy(ib);
    queue_destroy(q);
    fake_engine_free(a);
    fake_engine_free(b2);
}
END_TEST

START_TEST(stop_drains_queued_images_before_the_batcher_exits)
{
    reset_counts();
    fake_engine f = { 0 };
    engine *e = fake_engine_create(&f, 2, 4);
    char err[256];
    queue *q = queue_create(64, err, sizeof err);
    infer *inf = infer_create(e, NULL, NULL, NULL, &test_sink, err, sizeof err);
    batch_policy p = policy(4, 10000000); /* would wait 10 s for a full batch */
    batcher *b = batcher_start(q, inf, &p, &test_sink, NULL, 0, err, sizeof err);
    push_images(q, 0, 3);
    uint64_t t0 = clock_now_us();
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    ck_assert_uint_lt(clock_now_us() - t0, 2000000);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(atomic_load(&done_count[i]), 1);
    infer_destroy(inf);
    queue_destroy(q);
    fake_engine_free(e);
}
END_TEST

/* ---- with a device decoder ------------------------------------------------ */

/* A stand-in for the GPU decoder: "decodes" a 1-byte JPEG {v} into a crop of
 * value v at its position in the engine's (host) input, fails on anything
 * longer (a real JPEG) so that the batcher's CPU fallback runs, and can be
 * told to fail the whole stage. */
typedef struct fake_dj {
    engine *e;
    queue *q; /* when set: each stage checks its pixels count as backlog */
    atomic_int fail_next, stages, max_nhost, host_out_of_order, uncounted;
} fake_dj;

static devjpeg_reason fake_dj_check(void *ctx, const uint8_t *jpeg, size_t len, const preprocess_info *info)
{
    (void)ctx;
    (void)jpeg;
    (void)len;
    (void)info;
    return DEVJPEG_OK;
}

static int fake_dj_stage(void *ctx, int slot, int nhost, const uint8_t *const *jpeg, const size_t *len, const int *w,
                         const int *h, int n, devjpeg_fallback_fn fallback, void *cls, int *nfallback, char *err,
                         size_t errlen)
{
    fake_dj *d = ctx;
    atomic_fetch_add(&d->stages, 1);
    if (atomic_exchange(&d->fail_next, 0)) {
        snprintf(err, errlen, "fake device error");
        return -1;
    }
    uint64_t px = 0;
    for (int i = 0; i < n; i++)
        px += (uint64_t)w[i] * (uint64_t)h[i];
    if (d->q && queue_jpeg_pixels(d->q) < px)
        atomic_fetch_add(&d->uncounted, 1);
    uint8_t *in = d->e->input[slot];
    for (int i = 0; i < nhost; i++) /* the CPU crops come first: ids below 10 or above 21 here */
        if (in[(size_t)i * RESNET18_INPUT_BYTES] >= 10 && in[(size_t)i * RESNET18_INPUT_BYTES] <= 21)
            atomic_fetch_add(&d->host_out_of_order, 1);
    int m = atomic_load(&d->max_nhost);
    while (nhost > m && !atomic_compare_exchange_weak(&d->max_nhost, &m, nhost))
        ;
    for (int i = 0; i < n; i++) {
        uint8_t *out = in + (size_t)(nhost + i) * RESNET18_INPUT_BYTES;
        if (len[i] == 1) {
            memset(out, jpeg[i][0], RESNET18_INPUT_BYTES);
        } else {
            ++*nfallback;
            fallback(cls, i, out);
        }
    }
    return 0;
}

static double fake_dj_stage_ms(void *ctx, int slot)
{
    (void)ctx;
    (void)slot;
    return 1.5;
}

static void fake_dj_destroy(void *ctx)
{
    (void)ctx;
}

static const devjpeg_ops fake_dj_ops = { .name = "fake",
                                         .check = fake_dj_check,
                                         .stage = fake_dj_stage,
                                         .stage_ms = fake_dj_stage_ms,
                                         .destroy = fake_dj_destroy };

static atomic_int gpu_timed;

static void sink_done_gpu(void *req, int image, const float *logits, int classes, served_model *model,
                          const pipeline_timing *t)
{
    if (t->gpu_decode_us == 1500)
        atomic_fetch_add(&gpu_timed, 1);
    sink_done(req, image, logits, classes, model, t);
}

static const pipeline_sink gpu_sink = { .done = sink_done_gpu, .fail = sink_fail };

/* A grey w x h JPEG of value v: decodes to exactly v. */
static uint8_t *grey_jpeg(int v, size_t *len)
{
    enum { W = 64, H = 48 };
    static uint8_t px[W * H];
    memset(px, v, sizeof px);
    tjhandle tj = tjInitCompress();
    unsigned char *out = NULL;
    unsigned long n = 0;
    ck_assert(tjCompress2(tj, px, W, 0, H, TJPF_GRAY, &out, &n, TJSAMP_GRAY, 95, 0) == 0);
    uint8_t *copy = malloc(n);
    memcpy(copy, out, n);
    *len = n;
    tjFree(out);
    tjDestroy(tj);
    return copy;
}

static void push_compressed(queue *q, int id, const uint8_t *jpeg, size_t len)
{
    int slot;
    ck_assert_int_eq(queue_reserve(q, 1, &slot), 0);
    uint64_t now = clock_now_us();
    queue_item it = { .req = (void *)(intptr_t)(id + 1),
                      .image = 0,
                      .slot = slot,
                      .fd = -1,
                      .jpeg = jpeg,
                      .jpeg_len = len,
                      .w = 2000,
                      .h = 1500,
                      .enqueued_us = now,
                      .deadline_us = now + 60000000u };
    queue_push(q, &it, 1);
}

START_TEST(device_decoder_fills_the_slot_behind_cpu_crops_and_falls_back_per_image)
{
    reset_counts();
    atomic_store(&gpu_timed, 0);
    fake_engine f = { 0 };
    engine *e = fake_engine_create(&f, 2, 8);
    fake_dj fd = { .e = e };
    devjpeg dj = { .ops = &fake_dj_ops, .ctx = &fd };
    char err[256];
    queue *q = queue_create(64, err, sizeof err);
    fd.q = q;
    decode_route route;
    decode_route_init(&route, 1);
    const uint64_t seed_ps = decode_route_gpu_ps(&route);
    infer *inf = infer_create(e, NULL, &dj, &route, &gpu_sink, err, sizeof err);
    batch_policy p = policy(8, 10000000); /* full batches only: 24 images make 3 */
    batcher *b = batcher_start(q, inf, &p, &gpu_sink, &dj, 1u << 20, err, sizeof err);
    ck_assert_ptr_nonnull(b);

    /* Interleaved: ids 0-9 decoded on the CPU (crops in queue slots), ids
     * 10-19 compressed; id 20 a real JPEG the device "fails" and the CPU
     * decodes; id 21 a broken one the CPU refuses too; ids 22-23 on the CPU. */
    static uint8_t one[22];
    size_t real_len, bad_len = 32;
    uint8_t *real = grey_jpeg(20, &real_len);
    uint8_t bad[32] = { 0xFF, 0xD8, 0xFF, 0xDB, 0x00 };
    for (int id = 0; id < 10; id++) {
        push_images(q, id, 1);
        one[10 + id] = (uint8_t)(10 + id);
        push_compressed(q, 10 + id, &one[10 + id], 1);
    }
    push_compressed(q, 20, real, real_len);
    push_compressed(q, 21, bad, bad_len);
    push_images(q, 22, 2);
    wait_reported(24);
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    for (int i = 0; i < 24; i++) {
        if (i == 21)
            continue;
        ck_assert_msg(atomic_load(&done_count[i]) == 1, "image %d: %d answers", i, atomic_load(&done_count[i]));
        ck_assert_int_eq(atomic_load(&fail_count[i]), 0);
    }
    ck_assert_int_eq(atomic_load(&done_count[21]), 0);
    ck_assert_int_eq(atomic_load(&fail_count[21]), 1);
    ck_assert_int_eq(atomic_load(&fail_status), 400);
    ck_assert_int_eq(atomic_load(&wrong_pixels), 0); /* every image at the position its logits came from */
    ck_assert_int_eq(atomic_load(&fd.host_out_of_order), 0);
    ck_assert_int_gt(atomic_load(&fd.max_nhost), 0);
    ck_assert_int_eq(atomic_load(&gpu_timed), 11); /* the compressed ones carry the stage time */
    ck_assert_uint_ne(decode_route_gpu_ps(&route), seed_ps); /* and the router learnt what it cost */
    ck_assert_int_eq(atomic_load(&fd.uncounted), 0); /* a stage's own pixels were backlog while it ran */
    ck_assert_uint_eq(queue_jpeg_pixels(q), 0); /* and none is left counted */
    infer_destroy(inf);
    queue_destroy(q);
    fake_engine_free(e);
    free(real);
}
END_TEST

START_TEST(device_decoder_error_fails_its_batch_with_500)
{
    reset_counts();
    fake_engine f = { 0 };
    engine *e = fake_engine_create(&f, 1, 4);
    fake_dj fd = { .e = e };
    devjpeg dj = { .ops = &fake_dj_ops, .ctx = &fd };
    char err[256];
    queue *q = queue_create(16, err, sizeof err);
    infer *inf = infer_create(e, NULL, &dj, NULL, &gpu_sink, err, sizeof err);
    batch_policy p = policy(4, 10000000); /* full batches only */
    batcher *b = batcher_start(q, inf, &p, &gpu_sink, &dj, 1u << 20, err, sizeof err);
    atomic_store(&fd.fail_next, 1);
    static uint8_t one[4] = { 1, 2, 3, 4 };
    push_images(q, 0, 2);
    push_compressed(q, 2, &one[2], 1);
    push_compressed(q, 3, &one[3], 1);
    wait_reported(4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(atomic_load(&fail_count[i]), 1);
    ck_assert_int_eq(atomic_load(&fail_status), 500);
    /* The next batch goes through. */
    push_compressed(q, 4, &one[0], 1);
    push_images(q, 5, 3);
    wait_reported(8);
    ck_assert_int_eq(atomic_load(&done_count[4]), 1);
    queue_stop(q);
    batcher_join(b);
    infer_stop(inf);
    infer_destroy(inf);
    queue_destroy(q);
    fake_engine_free(e);
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
    TCase *tp = tcase_create("pipeline");
    tcase_add_test(tp, pipeline_keeps_two_batches_in_flight_and_reports_each_image_once);
    tcase_add_test(tp, engine_failure_fails_its_batch_with_500_until_a_batch_succeeds);
    tcase_add_test(tp, stop_drains_queued_images_before_the_batcher_exits);
    tcase_add_test(tp, swap_moves_batches_to_the_new_engine_without_losing_any);
    tcase_add_test(tp, engines_share_one_queue);
    tcase_add_test(tp, device_decoder_fills_the_slot_behind_cpu_crops_and_falls_back_per_image);
    tcase_add_test(tp, device_decoder_error_fails_its_batch_with_500);
    suite_add_tcase(s, tp);
    return s;
}

int main(void)
{
    metrics_init("test", "cpu", "fp32");
    return testutil_run(suite());
}
