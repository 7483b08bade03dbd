/* Tests daemon/api/request.c's parsers for client input: Content-Type,
 * ?top_k=, and the multipart/form-data splitter (including hostile and
 * truncated bodies, which must fail cleanly rather than read past the end). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/api/request.h"
#include "tests/lib/testutil.h"

START_TEST(content_types_map_to_body_kinds)
{
    request_body_kind k;
    char b[72];
    ck_assert_int_eq(request_parse_content_type("image/jpeg", &k, b, sizeof b), 0);
    ck_assert_int_eq(k, REQ_BODY_RAW);
    ck_assert_int_eq(request_parse_content_type("Image/JPEG; charset=binary", &k, b, sizeof b), 0);
    ck_assert_int_eq(request_parse_content_type(NULL, &k, b, sizeof b), 0);
    ck_assert_int_eq(request_parse_content_type("application/x-www-form-urlencoded", &k, b, sizeof b), 0);
    ck_assert_int_eq(request_parse_content_type("application/octet-stream", &k, b, sizeof b), 0);
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; boundary=abc123", &k, b, sizeof b), 0);
    ck_assert_int_eq(k, REQ_BODY_MULTIPART);
    ck_assert_str_eq(b, "abc123");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; charset=x; boundary=\"q u\"", &k, b, sizeof b),
                     0);
    ck_assert_str_eq(b, "q u");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data", &k, b, sizeof b), -2);
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; boundary=\"open", &k, b, sizeof b), -2);
    char longb[200] = "multipart/form-data; boundary=";
    memset(longb + strlen(longb), 'x', 80);
    ck_assert_int_eq(request_parse_content_type(longb, &k, b, sizeof b), -2);
    ck_assert_int_eq(request_parse_content_type("image/png", &k, b, sizeof b), -1);
    ck_assert_int_eq(request_parse_content_type("text/plain", &k, b, sizeof b), -1);
    ck_assert_int_eq(request_parse_content_type("image/jpegx", &k, b, sizeof b), -1);
}
END_TEST

/* L7: parameters are walked in order, so a quoted value of another
 * parameter cannot smuggle a boundary in, and a quoted boundary is
 * unquoted (escapes resolved). */
START_TEST(content_type_parameters_honour_quoting)
{
    request_body_kind k;
    char b[72];
    ck_assert_int_eq(
        request_parse_content_type("multipart/form-data; foo=\"x; boundary=evil\"; boundary=B", &k, b, sizeof b), 0);
    ck_assert_str_eq(b, "B");
    ck_assert_int_eq(
        request_parse_content_type("multipart/form-data; foo=\"a\\\"; boundary=evil\"; boundary=B", &k, b, sizeof b),
        0);
    ck_assert_str_eq(b, "B");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; boundary=\"a b;c\"", &k, b, sizeof b), 0);
    ck_assert_str_eq(b, "a b;c");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; boundary=\"q\\\"x\"", &k, b, sizeof b), 0);
    ck_assert_str_eq(b, "q\"x");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data;boundary=B ; charset=utf-8", &k, b, sizeof b), 0);
    ck_assert_str_eq(b, "B");
    ck_assert_int_eq(request_parse_content_type("multipart/form-data; xboundary=A; boundary=B", &k, b, sizeof b), 0);
    ck_assert_str_eq(b, "B");
    const char *bad[] = {
        "multipart/form-data; foo=\"x; boundary=evil\"", /* only inside a quoted value */
        "multipart/form-data; boundary=\"\"", /* empty */
        "multipart/form-data; boundary=a\"b", /* stray quote */
        "multipart/form-data; boundary=\"a\"b", /* text after the quoted value */
        "multipart/form-data; =x; boundary=B", /* no parameter name */
        "multipart/form-data; boundary", /* no '=' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(request_parse_content_type(bad[i], &k, b, sizeof b) == -2, "'%s' accepted", bad[i]);
}
END_TEST

START_TEST(top_k_accepts_only_1_to_the_model_classes)
{
    int k = 5;
    ck_assert_int_eq(request_parse_top_k("1", 1000, &k), 0);
    ck_assert_int_eq(k, 1);
    ck_assert_int_eq(request_parse_top_k("1000", 1000, &k), 0);
    ck_assert_int_eq(k, 1000);
    /* L8: one rule for leading zeros, whatever their number: refused. */
    const char *bad[] = { "",      "0",     "1001",
                          "-1",    "5x",    " 5",
                          "99999", "1e2",   "05",
                          "0005",  "00005", "000000000005",
                          "+5",    "5%005", "99999999999999999999999" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(request_parse_top_k(bad[i], 1000, &k) == -1, "'%s' accepted", bad[i]);
    ck_assert_int_eq(k, 1000);
    /* A fine-tuned head: the bound is its class count, either way of 1000. */
    ck_assert_int_eq(request_parse_top_k("10", 10, &k), 0);
    ck_assert_int_eq(k, 10);
    ck_assert_int_eq(request_parse_top_k("11", 10, &k), -1);
    ck_assert_int_eq(request_parse_top_k("5", 3, &k), -1);
    ck_assert_int_eq(request_parse_top_k("21841", 21841, &k), 0);
    ck_assert_int_eq(k, 21841);
    ck_assert_int_eq(request_parse_top_k("21842", 21841, &k), -1);
}
END_TEST

static int parse(const char *body, const char *boundary, request_part *parts, int max, char *err)
{
    return request_parse_multipart((const uint8_t *)body, strlen(body), boundary, "image", parts, max, err, 256);
}

START_TEST(multipart_finds_image_fields_in_order)
{
    const char *body = "preamble\r\n"
                       "--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"other\"\r\n\r\n"
                       "ignored\r\n"
                       "--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"image\"; filename=\"a.jpg\"\r\n"
                       "Content-Type: image/jpeg\r\n\r\n"
                       "AAAA\r\n--XyQ near miss\r\n"
                       "--XyZ\r\n"
                       "content-disposition: form-data; filename=\"name.jpg\"; name=\"image\"\r\n\r\n"
                       "BB\r\n"
                       "--XyZ--\r\n"
                       "epilogue";
    request_part parts[4];
    char err[256];
    ck_assert_int_eq(parse(body, "XyZ", parts, 4, err), 2);
    ck_assert_uint_eq(parts[0].len, strlen("AAAA\r\n--XyQ near miss"));
    ck_assert(memcmp(parts[0].data, "AAAA", 4) == 0);
    ck_assert_uint_eq(parts[1].len, 2);
    ck_assert(memcmp(parts[1].data, "BB", 2) == 0);
}
END_TEST

START_TEST(multipart_body_may_start_with_the_delimiter)
{
    const char *body = "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n\xff\xd8\r\n--b--";
    request_part parts[1];
    char err[256];
    ck_assert_int_eq(parse(body, "b", parts, 1, err), 1);
    ck_assert_uint_eq(parts[0].len, 2);
}
END_TEST

START_TEST(multipart_binary_content_with_crlf_and_nul)
{
    static const char body[] = "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n"
                               "\r\n\0\r\n--\r\n-b\0\r\n--b--\r\n";
    request_part parts[1];
    char err[256];
    int n = request_parse_multipart((const uint8_t *)body, sizeof body - 1, "b", "image", parts, 1, err, sizeof err);
    ck_assert_int_eq(n, 1);
    ck_assert_uint_eq(parts[0].len, 12);
}
END_TEST

START_TEST(multipart_without_image_field_finds_none)
{
    const char *body = "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"image\"\r\n\r\nxx\r\n--b--";
    request_part parts[1];
    char err[256];
    ck_assert_int_eq(parse(body, "b", parts, 1, err), 0);
}
END_TEST

START_TEST(multipart_counts_parts_beyond_max)
{
    const char *body = "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n1\r\n"
                       "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n2\r\n"
                       "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\n3\r\n--b--";
    request_part parts[2];
    char err[256];
    ck_assert_int_eq(parse(body, "b", parts, 2, err), 3);
}
END_TEST

START_TEST(malformed_multipart_bodies_fail_cleanly)
{
    const char *bad[] = {
        "",
        "no boundary at all",
        "--b", /* ends after delimiter */
        "--bX\r\n", /* delimiter not followed by CRLF */
        "--b\r\nContent-Disposition: form-data; name=\"image\"", /* headers never end */
        "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\ndata without end",
        "--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\ndata\r\n--b", /* no close, no CRLF */
        "--b\r\nContent-Disposition: form-data; name=\"ima",
    };
    request_part parts[2];
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        /* Copy to an exact-size heap buffer so a read past the end is
         * caught by ASan/valgrind. */
        size_t len = strlen(bad[i]);
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, bad[i], len);
        int n = request_parse_multipart(buf, len, "b", "image", parts, 2, err, sizeof err);
        ck_assert_msg(n == -1, "body %zu parsed as %d parts", i, n);
        ck_assert_msg(err[0], "body %zu: no reason given", i);
        free(buf);
    }
}
END_TEST

/* M5: an empty body is refused without handing a NULL pointer to memmem
 * (UBSan's nonnull check in the sanitizer build). */
START_TEST(empty_multipart_body_is_refused)
{
    request_part parts[1];
    char err[256] = "";
    ck_assert_int_eq(request_parse_multipart(NULL, 0, "b", "image", parts, 1, err, sizeof err), -1);
    ck_assert_str_eq(err, "multipart body is empty");
}
END_TEST

/* L3: %00 is never decoded, so no NUL can cut a path or a value short. */
START_TEST(unescape_decodes_everything_but_nul)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "/healthz%00", "/healthz%00" },
        { "5%005", "5%005" },
        { "%41%62c", "Abc" },
        { "%2f%2F", "//" },
        { "%zz%4", "%zz%4" },
        { "100%", "100%" },
        { "%ff", "\xff" },
        { "", "" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].in);
        size_t n = request_unescape(buf);
        ck_assert_str_eq(buf, cases[i].out);
        ck_assert_uint_eq(n, strlen(cases[i].out));
    }
    int k = 0;
    char q[] = "5%005";
    request_unescape(q);
    ck_assert_int_eq(request_parse_top_k(q, 1000, &k), -1);
}
END_TEST

START_TEST(every_prefix_of_a_valid_body_is_handled)
{
    const char *body = "--bnd\r\nContent-Disposition: form-data; name=\"image\"; filename=\"x\"\r\n"
                       "Content-Type: image/jpeg\r\n\r\nJPEGDATA\r\n--bnd--\r\n";
    size_t full = strlen(body);
    request_part parts[1];
    char err[256];
    for (size_t len = 0; len <= full; len++) {
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, body, len);
        int n = request_parse_multipart(buf, len, "bnd", "image", parts, 1, err, sizeof err);
        ck_assert(n == -1 || n == 1);
        if (n == 1)
            ck_assert_uint_eq(parts[0].len, 8);
        free(buf);
    }
}
END_TEST

START_TEST(request_body_grows_and_failures_keep_the_first)
{
    request *r = request_create();
    ck_assert_ptr_nonnull(r);
    r->expect = 200000;
    uint8_t chunk[1000];
    memset(chunk, 7, sizeof chunk);
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(request_append(r, chunk, sizeof chunk), 0);
    ck_assert_uint_eq(r->len, 200000);
    ck_assert_int_eq(r->body[199999], 7);
    ck_assert_uint_eq(r->cap, 200000); /* an announced length: no buffer past it */
    ck_assert_int_eq(request_append(r, chunk, 1), 0); /* and it still grows past it */
    ck_assert_uint_eq(r->len, 200001);
    request_fail(r, 504, "timeout", "first");
    request_fail(r, 500, "engine_failure", "second");
    ck_assert_int_eq(r->fail_status, 504);
    ck_assert_str_eq(r->fail_msg, "first");
    request_free(r);
}
END_TEST

START_TEST(request_body_is_charged_to_the_budget)
{
    budget b;
    budget_init(&b, 300 * 1024);
    request *r = request_create();
    ck_assert_ptr_nonnull(r);
    r->budget = &b;
    /* A huge announced length reserves nothing: memory follows the bytes. */
    r->expect = 16u << 20;
    uint8_t chunk[1000];
    memset(chunk, 7, sizeof chunk);
    ck_assert_int_eq(request_append(r, chunk, sizeof chunk), 0);
    ck_assert_uint_eq(budget_used(&b), r->cap);
    ck_assert_uint_le(r->cap, 64 * 1024);
    int rc = 0, appended = 1;
    while ((rc = request_append(r, chunk, sizeof chunk)) == 0)
        appended++;
    ck_assert_int_eq(rc, -2); /* the budget, not the allocator, said no */
    ck_assert_uint_eq(r->len, (size_t)appended * sizeof chunk);
    ck_assert_uint_eq(budget_used(&b), r->cap);
    ck_assert_uint_le(budget_used(&b), 300 * 1024);
    /* A second request gets what the first gives back. */
    request *r2 = request_create();
    ck_assert_ptr_nonnull(r2);
    r2->budget = &b;
    request_drop_body(r);
    ck_assert_uint_eq(budget_used(&b), 0);
    ck_assert_int_eq(request_append(r2, chunk, sizeof chunk), 0);
    request_free(r2);
    request_free(r);
    ck_assert_uint_eq(budget_used(&b), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("request");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, content_types_map_to_body_kinds);
    tcase_add_test(tc, content_type_parameters_honour_quoting);
    tcase_add_test(tc, top_k_accepts_only_1_to_the_model_classes);
    tcase_add_test(tc, empty_multipart_body_is_refused);
    tcase_add_test(tc, unescape_decodes_everything_but_nul);
    tcase_add_test(tc, multipart_finds_image_fields_in_order);
    tcase_add_test(tc, multipart_body_may_start_with_the_delimiter);
    tcase_add_test(tc, multipart_binary_content_with_crlf_and_nul);
    tcase_add_test(tc, multipart_without_image_field_finds_none);
    tcase_add_test(tc, multipart_counts_parts_beyond_max);
    tcase_add_test(tc, malformed_multipart_bodies_fail_cleanly);
    tcase_add_test(tc, every_prefix_of_a_valid_body_is_handled);
    tcase_add_test(tc, request_body_grows_and_failures_keep_the_first);
    tcase_add_test(tc, request_body_is_charged_to_the_budget);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(suite());
}
