/* Tests util/utf8.c: RFC 3629 validation (overlongs, surrogates, past
 * U+10FFFF and truncated sequences are invalid) and the sanitiser used on
 * echoed client text, which must never cut a character in two. */
#include <check.h>
#include <string.h>
#include "util/utf8.h"
#include "tests/lib/testutil.h"

START_TEST(valid_and_invalid_sequences)
{
    static const struct {
        const char *s;
        size_t bad;
    } cases[] = {
        { "plain ascii", 11 },
        { "caf\xc3\xa9", 5 },
        { "\xe2\x82\xac", 3 },
        { "\xf0\x9f\x98\x80", 4 },
        { "caf\xe9", 3 },
        { "\xc0\xaf", 0 },
        { "\xe0\x80\xaf", 0 },
        { "\xed\xa0\x80", 0 },
        { "\xf4\x90\x80\x80", 0 },
        { "ok\xc3", 2 },
        { "ok\xe2\x82", 2 },
        { "\xff", 0 },
        { "a\x80", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(utf8_invalid_at(cases[i].s, strlen(cases[i].s)) == cases[i].bad, "case %zu", i);
}
END_TEST

START_TEST(sanitize_escapes_bad_bytes_and_keeps_characters_whole)
{
    char out[64];
    ck_assert_str_eq(utf8_sanitize(out, sizeof out, "/caf\xe9"), "/caf\\xE9");
    ck_assert_str_eq(utf8_sanitize(out, sizeof out, "image/\xff\xfe"), "image/\\xFF\\xFE");
    ck_assert_str_eq(utf8_sanitize(out, sizeof out, "caf\xc3\xa9"), "caf\xc3\xa9");
    ck_assert_str_eq(utf8_sanitize(out, 6, "caf\xc3\xa9"), "caf\xc3\xa9");
    ck_assert_str_eq(utf8_sanitize(out, 5, "caf\xc3\xa9"), "caf"); /* not half an e-acute */
    ck_assert_str_eq(utf8_sanitize(out, 6, "ab\xff"), "ab"); /* not half of \xFF */
    ck_assert_str_eq(utf8_sanitize(out, 1, "abc"), "");
    ck_assert_uint_eq(utf8_invalid_at(out, strlen(out)), strlen(out));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("utf8");
    TCase *tc = tcase_create("utf8");
    tcase_add_test(tc, valid_and_invalid_sequences);
    tcase_add_test(tc, sanitize_escapes_bad_bytes_and_keeps_characters_whole);
    suite_add_tcase(s, tc);
    return testutil_run(s);
}
