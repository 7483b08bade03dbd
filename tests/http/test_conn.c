/* Tests daemon/http/conn.c: the slow-client decision with a fake clock
 * (headers bounded in total however they trickle, bodies judged on their
 * average rate after a grace, the server's turn never judged). The HTTP
 * layer applying it on real sockets: tests/http/test_http.c. */
#include <check.h>
#include "daemon/http/conn.h"
#include "tests/lib/testutil.h"

static const conn_limits limits = { .header_timeout_us = 10000000, .min_rate = 1000 };

START_TEST(headers_are_bounded_in_total)
{
    ck_assert_int_eq(conn_judge(&limits, CONN_HEADERS, 0, 0, 10000000), CONN_OK);
    ck_assert_int_eq(conn_judge(&limits, CONN_HEADERS, 0, 0, 10000001), CONN_SLOW_HEADERS);
    /* Bytes do not buy time while the headers arrive. */
    ck_assert_int_eq(conn_judge(&limits, CONN_HEADERS, 0, 1 << 20, 10000001), CONN_SLOW_HEADERS);
    /* The clock starts at the phase, not at 0. */
    ck_assert_int_eq(conn_judge(&limits, CONN_HEADERS, 5000000, 0, 14000000), CONN_OK);
}
END_TEST

START_TEST(bodies_are_judged_on_their_average_rate_after_the_grace)
{
    /* Within the grace: nothing needed. */
    ck_assert_int_eq(conn_judge(&limits, CONN_BODY, 0, 0, 10000000), CONN_OK);
    /* After it: at least min_rate x elapsed. */
    ck_assert_int_eq(conn_judge(&limits, CONN_BODY, 0, 11000, 11000000), CONN_OK);
    ck_assert_int_eq(conn_judge(&limits, CONN_BODY, 0, 10999, 11000000), CONN_SLOW_BODY);
    /* One byte every 10 s is far below. */
    ck_assert_int_eq(conn_judge(&limits, CONN_BODY, 0, 3, 30000000), CONN_SLOW_BODY);
    /* min_rate 0: no minimum. */
    conn_limits none = limits;
    none.min_rate = 0;
    ck_assert_int_eq(conn_judge(&none, CONN_BODY, 0, 0, 3600000000u), CONN_OK);
}
END_TEST

START_TEST(the_servers_turn_is_never_judged)
{
    ck_assert_int_eq(conn_judge(&limits, CONN_SERVER, 0, 0, 3600000000u), CONN_OK);
    /* A clock that went backwards is not a slow client. */
    ck_assert_int_eq(conn_judge(&limits, CONN_HEADERS, 20000000, 0, 10000000), CONN_OK);
}
END_TEST

static Suite *conn_suite(void)
{
    Suite *s = suite_create("conn");
    TCase *tc = tcase_create("conn");
    tcase_add_test(tc, headers_are_bounded_in_total);
    tcase_add_test(tc, bodies_are_judged_on_their_average_rate_after_the_grace);
    tcase_add_test(tc, the_servers_turn_is_never_judged);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(conn_suite());
}
