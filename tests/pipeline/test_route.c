/* Tests daemon/pipeline/route.c: the GPU/CPU decode decision and its measured means. */
#include <check.h>
#include "daemon/pipeline/route.h"
#include "tests/lib/testutil.h"

#define MP 1000000

START_TEST(an_idle_gpu_takes_every_image_it_decodes_faster)
{
    /* 140 ps a pixel on the GPU, 12,000 on one core: nothing waits */
    ck_assert(!decode_route_cpu_sooner(12000, 140, 1, 800, 600, 0));
    ck_assert(!decode_route_cpu_sooner(3000, 140, 1, 4000, 3000, 0));
}
END_TEST

START_TEST(the_cpu_takes_an_image_once_the_gpu_backlog_outlasts_its_decode_twice)
{
    /* 12 MP: 36 ms on one core, 1.68 ms each on the GPU: the GPU's backlog
     * must outlast twice the decode, past ~41.9 queued photos */
    const int w = 4000, h = 3000;
    ck_assert(!decode_route_cpu_sooner(3000, 140, 1, w, h, 41ull * w * h));
    ck_assert(decode_route_cpu_sooner(3000, 140, 1, w, h, 42ull * w * h));
    /* two GPUs drain the same queue twice as fast */
    ck_assert(!decode_route_cpu_sooner(3000, 140, 2, w, h, 42ull * w * h));
    ck_assert(decode_route_cpu_sooner(3000, 140, 2, w, h, 85ull * w * h));
    /* a web photo needs a far longer backlog: 6 ms vs 0.07 ms each */
    ck_assert(!decode_route_cpu_sooner(12000, 140, 1, 1000, 500, 85ull * MP));
    ck_assert(decode_route_cpu_sooner(12000, 140, 1, 1000, 500, 86ull * MP));
}
END_TEST

START_TEST(means_follow_measurements_per_size_class)
{
    decode_route r;
    decode_route_init(&r, 1);
    ck_assert_int_eq(decode_route_class(999, 1000), 0);
    ck_assert_int_eq(decode_route_class(1000, 1000), 1);
    ck_assert_int_eq(decode_route_class(2000, 2000), 2);
    uint64_t small = decode_route_cpu_ps(&r, 0), big = decode_route_cpu_ps(&r, 2);
    /* a 12 MP decode of 24 ms: 2,000 ps a pixel; the small class keeps its seed */
    for (int i = 0; i < 100; i++)
        decode_route_cpu(&r, 4000, 3000, 24000000);
    ck_assert_uint_eq(decode_route_cpu_ps(&r, 0), small);
    ck_assert_uint_ne(big, 2000);
    ck_assert_uint_lt(
        decode_route_cpu_ps(&r, 2) > 2000 ? decode_route_cpu_ps(&r, 2) - 2000 : 2000 - decode_route_cpu_ps(&r, 2), 20);
    /* batches of 64 0.5 MP images in 4 ms: 125 ps a pixel */
    for (int i = 0; i < 100; i++)
        decode_route_gpu(&r, 64ull * 500000, 4000000);
    ck_assert_uint_lt(decode_route_gpu_ps(&r) > 125 ? decode_route_gpu_ps(&r) - 125 : 125 - decode_route_gpu_ps(&r), 3);
    /* a small stage, whatever it cost, is no sample */
    decode_route_gpu(&r, 64 * 48, 3600000);
    ck_assert_uint_lt(decode_route_gpu_ps(&r), 130);
    /* one outlier moves the mean by an eighth of the difference */
    decode_route_gpu(&r, 8ull * MP, 8000000000ull); /* 1,000,000 ps a pixel */
    ck_assert_uint_gt(decode_route_gpu_ps(&r), 100000);
    ck_assert_uint_lt(decode_route_gpu_ps(&r), 130000);
    /* and the decision uses the current means */
    ck_assert(decode_route_to_cpu(&r, 4000, 3000, 1000ull * MP));
    decode_route_gpu(&r, 0, 5); /* no pixels: no sample */
    ck_assert_uint_gt(decode_route_gpu_ps(&r), 100000);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("route");
    TCase *tc = tcase_create("route");
    tcase_add_test(tc, an_idle_gpu_takes_every_image_it_decodes_faster);
    tcase_add_test(tc, the_cpu_takes_an_image_once_the_gpu_backlog_outlasts_its_decode_twice);
    tcase_add_test(tc, means_follow_measurements_per_size_class);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
