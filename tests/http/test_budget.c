/* Tests daemon/http/budget.c: the cap is never passed, a refused acquire takes
 * nothing, releases give bytes back, and concurrent acquirers together
 * never overshoot the cap. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include "daemon/http/budget.h"
#include "tests/lib/testutil.h"

START_TEST(acquire_up_to_the_cap_and_no_further)
{
    budget b;
    budget_init(&b, 1000);
    ck_assert_uint_eq(budget_cap(&b), 1000);
    ck_assert_int_eq(budget_try_acquire(&b, 600), 0);
    ck_assert_int_eq(budget_try_acquire(&b, 400), 0);
    ck_assert_uint_eq(budget_used(&b), 1000);
    ck_assert_int_eq(budget_try_acquire(&b, 1), -1);
    ck_assert_int_eq(budget_try_acquire(&b, 0), 0);
    ck_assert_uint_eq(budget_used(&b), 1000);
}
END_TEST

START_TEST(refused_acquire_takes_nothing)
{
    budget b;
    budget_init(&b, 1000);
    ck_assert_int_eq(budget_try_acquire(&b, 900), 0);
    ck_assert_int_eq(budget_try_acquire(&b, 101), -1);
    ck_assert_uint_eq(budget_used(&b), 900);
    ck_assert_int_eq(budget_try_acquire(&b, 100), 0);
}
END_TEST

START_TEST(huge_request_does_not_wrap)
{
    budget b;
    budget_init(&b, 1000);
    ck_assert_int_eq(budget_try_acquire(&b, 10), 0);
    ck_assert_int_eq(budget_try_acquire(&b, SIZE_MAX), -1);
    ck_assert_int_eq(budget_try_acquire(&b, SIZE_MAX - 5), -1);
    ck_assert_uint_eq(budget_used(&b), 10);
}
END_TEST

START_TEST(release_gives_bytes_back)
{
    budget b;
    budget_init(&b, 100);
    ck_assert_int_eq(budget_try_acquire(&b, 100), 0);
    budget_release(&b, 40);
    ck_assert_uint_eq(budget_used(&b), 60);
    ck_assert_int_eq(budget_try_acquire(&b, 41), -1);
    ck_assert_int_eq(budget_try_acquire(&b, 40), 0);
    budget_release(&b, 100);
    ck_assert_uint_eq(budget_used(&b), 0);
}
END_TEST

#define THREADS 4
#define ROUNDS 20000

typedef struct {
    budget *b;
    size_t peak_seen;
    int failed;
} racer;

/* Each thread acquires and releases chunks; the counter it sees right
 * after its own acquire must never be over the cap. */
static void *race(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < ROUNDS; i++) {
        size_t n = 1 + (size_t)(i % 7) * 50;
        if (budget_try_acquire(r->b, n) != 0)
            continue;
        size_t used = budget_used(r->b);
        if (used > budget_cap(r->b))
            r->failed = 1;
        if (used > r->peak_seen)
            r->peak_seen = used;
        budget_release(r->b, n);
    }
    return NULL;
}

START_TEST(concurrent_acquirers_never_pass_the_cap)
{
    budget b;
    budget_init(&b, 700);
    racer r[THREADS] = { { 0 } };
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i].b = &b;
        ck_assert_int_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        ck_assert_int_eq(pthread_join(t[i], NULL), 0);
        ck_assert_int_eq(r[i].failed, 0);
        ck_assert_uint_le(r[i].peak_seen, 700);
    }
    ck_assert_uint_eq(budget_used(&b), 0);
}
END_TEST

static Suite *budget_suite(void)
{
    Suite *s = suite_create("budget");
    TCase *tc = tcase_create("budget");
    tcase_add_test(tc, acquire_up_to_the_cap_and_no_further);
    tcase_add_test(tc, refused_acquire_takes_nothing);
    tcase_add_test(tc, huge_request_does_not_wrap);
    tcase_add_test(tc, release_gives_bytes_back);
    tcase_add_test(tc, concurrent_acquirers_never_pass_the_cap);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(budget_suite());
}
