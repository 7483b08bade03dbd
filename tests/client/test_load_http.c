/* Tests for resnetd-load's parsers: client/http_response.c (framing by
 * Content-Length, chunked and end of stream, in any split of the bytes;
 * keep-alive vs close; malformed answers) and client/prom.c (Prometheus
 * text samples and labels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "client/http_response.h"
#include "client/prom.h"
#include "tests/lib/testutil.h"

/* Feeds text in pieces of `step` bytes; returns the final result and the
 * total bytes consumed. */
static http_response_result feed_in_steps(http_response *r, const char *text, size_t step, size_t *consumed)
{
    size_t len = strlen(text), off = 0;
    http_response_result res = HTTP_RESPONSE_MORE;
    while (off < len && res == HTTP_RESPONSE_MORE) {
        size_t n = len - off < step ? len - off : step, used;
        res = http_response_feed(r, text + off, n, &used);
        off += used;
        if (res == HTTP_RESPONSE_MORE)
            ck_assert_uint_eq(used, n);
    }
    *consumed = off;
    return res;
}

static const char ok_answer[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n"
                                "\r\n{\"results\":1}";

START_TEST(test_content_length_in_any_split)
{
    for (size_t step = 1; step <= sizeof ok_answer; step++) {
        http_response r;
        size_t used;
        http_response_init(&r, 1);
        ck_assert_int_eq(feed_in_steps(&r, ok_answer, step, &used), HTTP_RESPONSE_DONE);
        ck_assert_uint_eq(used, strlen(ok_answer));
        ck_assert_int_eq(r.status, 200);
        ck_assert_int_eq(r.close, 0);
        ck_assert_str_eq(r.body, "{\"results\":1}");
        http_response_free(&r);
    }
}
END_TEST

START_TEST(test_stops_at_the_end_of_the_first_answer)
{
    char two[512];
    snprintf(two, sizeof two, "%s%s", ok_answer, ok_answer);
    http_response r;
    size_t used;
    http_response_init(&r, 0);
    ck_assert_int_eq(http_response_feed(&r, two, strlen(two), &used), HTTP_RESPONSE_DONE);
    ck_assert_uint_eq(used, strlen(ok_answer));
}
END_TEST

START_TEST(test_chunked_with_extension_and_trailer)
{
    const char *text = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                       "5;name=x\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n";
    for (size_t step = 1; step <= strlen(text); step += 3) {
        http_response r;
        size_t used;
        http_response_init(&r, 1);
        ck_assert_int_eq(feed_in_steps(&r, text, step, &used), HTTP_RESPONSE_DONE);
        ck_assert_uint_eq(used, strlen(text));
        ck_assert_str_eq(r.body, "hello, world");
        http_response_free(&r);
    }
}
END_TEST

START_TEST(test_connection_close_and_http10)
{
    static const struct {
        const char *text;
        int close;
    } cases[] = {
        { "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 1 },
        { "HTTP/1.1 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n", 0 },
        { "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 1 },
        { "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        http_response r;
        size_t used;
        http_response_init(&r, 0);
        ck_assert_int_eq(http_response_feed(&r, cases[i].text, strlen(cases[i].text), &used), HTTP_RESPONSE_DONE);
        ck_assert_msg(r.close == cases[i].close, "case %zu: close %d", i, r.close);
    }
}
END_TEST

START_TEST(test_body_until_end_of_stream)
{
    const char *text = "HTTP/1.1 200 OK\r\n\r\npartial body";
    http_response r;
    size_t used;
    http_response_init(&r, 1);
    ck_assert_int_eq(http_response_feed(&r, text, strlen(text), &used), HTTP_RESPONSE_MORE);
    ck_assert_int_eq(http_response_eof(&r), HTTP_RESPONSE_DONE);
    ck_assert_int_eq(r.close, 1);
    ck_assert_str_eq(r.body, "partial body");
    http_response_free(&r);
}
END_TEST

START_TEST(test_close_before_the_end_is_an_error)
{
    const char *cuts[] = { "", "HTTP/1.1 20", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel" };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        http_response r;
        size_t used;
        http_response_init(&r, 0);
        if (cuts[i][0])
            ck_assert_int_eq(http_response_feed(&r, cuts[i], strlen(cuts[i]), &used), HTTP_RESPONSE_MORE);
        ck_assert_int_eq(http_response_started(&r), cuts[i][0] != '\0');
        ck_assert_int_eq(http_response_eof(&r), HTTP_RESPONSE_ERROR);
        ck_assert_ptr_nonnull(r.error);
    }
}
END_TEST

START_TEST(test_interim_100_continue_is_skipped)
{
    const char *text = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Payload Too Large\r\nContent-Length: 2\r\n\r\n{}";
    http_response r;
    size_t used;
    http_response_init(&r, 0);
    ck_assert_int_eq(http_response_feed(&r, text, strlen(text), &used), HTTP_RESPONSE_DONE);
    ck_assert_int_eq(r.status, 413);
    ck_assert_uint_eq(used, strlen(text));
}
END_TEST

START_TEST(test_malformed_answers_are_errors)
{
    const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "SSH-2.0-OpenSSH\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http_response r;
        size_t used;
        http_response_init(&r, 0);
        ck_assert_msg(http_response_feed(&r, bad[i], strlen(bad[i]), &used) == HTTP_RESPONSE_ERROR, "case %zu", i);
        ck_assert_ptr_nonnull(r.error);
    }
    /* a header line longer than the line buffer */
    char *huge = malloc(HTTP_RESPONSE_LINE_MAX + 64);
    ck_assert_ptr_nonnull(huge);
    strcpy(huge, "HTTP/1.1 200 OK\r\nX: ");
    memset(huge + strlen(huge), 'a', HTTP_RESPONSE_LINE_MAX);
    huge[HTTP_RESPONSE_LINE_MAX + 20] = '\0';
    http_response r;
    size_t used;
    http_response_init(&r, 0);
    ck_assert_int_eq(http_response_feed(&r, huge, strlen(huge), &used), HTTP_RESPONSE_ERROR);
    free(huge);
}
END_TEST

static const char metrics_text[] = "# HELP resnetd_batch_size Images per batch.\n"
                                   "# TYPE resnetd_batch_size histogram\n"
                                   "resnetd_batch_size_bucket{le=\"1\"} 3\n"
                                   "resnetd_batch_size_bucket{le=\"+Inf\"} 10\n"
                                   "resnetd_batch_size_sum 42\n"
                                   "resnetd_batch_size_count 10 1700000000000\n"
                                   "\n"
                                   "resnetd_rejected_total{reason=\"queue_full\"} 7\n"
                                   "resnetd_rejected_total{reason=\"client_gone\",x=\"a\\\"}b\"} 2\n"
                                   "resnetd_build_info{version=\"0.1.0\",device=\"cpu\"} 1\n"
                                   "process_start_time_seconds 1.7e+09\n"
                                   "odd_value NaN\n";

START_TEST(test_prom_samples_sums_and_labels)
{
    prom_set s = { 0 };
    char err[128];
    ck_assert_int_eq(prom_parse(metrics_text, &s, err, sizeof err), 0);
    ck_assert_uint_eq(s.n, 9);
    int found;
    ck_assert_double_eq(prom_sum(&s, "resnetd_batch_size_sum", &found), 42);
    ck_assert_int_eq(found, 1);
    ck_assert_double_eq(prom_sum(&s, "resnetd_batch_size_count", &found), 10);
    ck_assert_double_eq(prom_sum(&s, "resnetd_rejected_total", &found), 9);
    ck_assert_double_eq(prom_sum(&s, "process_start_time_seconds", &found), 1.7e9);
    prom_sum(&s, "resnetd_missing", &found);
    ck_assert_int_eq(found, 0);
    char buf[64];
    ck_assert_int_eq(prom_label(s.v[5].labels, "reason", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "client_gone");
    ck_assert_int_eq(prom_label(s.v[5].labels, "x", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "a\"}b");
    ck_assert_int_eq(prom_label(s.v[6].labels, "device", buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "cpu");
    ck_assert_int_eq(prom_label(s.v[6].labels, "reason", buf, sizeof buf), -1);
    prom_free(&s);
}
END_TEST

START_TEST(test_prom_rejects_non_samples)
{
    const char *bad[] = { "resnetd_x{reason=\"a\" 1\n", "9lives 1\n", "resnetd_x\n", "resnetd_x 1z\n",
                          "<html>not metrics</html>\n" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        prom_set s = { 0 };
        char err[128];
        ck_assert_msg(prom_parse(bad[i], &s, err, sizeof err) == -1, "case %zu accepted", i);
        ck_assert_ptr_nonnull(strstr(err, "line 1"));
        prom_free(&s);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("load_http");
    TCase *tc = tcase_create("http_response");
    tcase_add_test(tc, test_content_length_in_any_split);
    tcase_add_test(tc, test_stops_at_the_end_of_the_first_answer);
    tcase_add_test(tc, test_chunked_with_extension_and_trailer);
    tcase_add_test(tc, test_connection_close_and_http10);
    tcase_add_test(tc, test_body_until_end_of_stream);
    tcase_add_test(tc, test_close_before_the_end_is_an_error);
    tcase_add_test(tc, test_interim_100_continue_is_skipped);
    tcase_add_test(tc, test_malformed_answers_are_errors);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("prom");
    tcase_add_test(tp, test_prom_samples_sums_and_labels);
    tcase_add_test(tp, test_prom_rejects_non_samples);
    suite_add_tcase(s, tp);
    return testutil_run(s);
}
