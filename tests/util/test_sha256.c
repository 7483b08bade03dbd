/* Tests for util/sha256.c: the standard vectors, the streaming interface fed
 * in uneven pieces, and lengths around the padding edges against the
 * sha256sum tool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/sha256.h"
#include "tests/lib/testutil.h"
#include "tests/model/weights_testutil.h"

START_TEST(test_sha256_known_vectors)
{
    char hex[65];
    sha256_hex("", 0, hex);
    ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha256_hex("abc", 3, hex);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_hex(two, strlen(two), hex);
    ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *a = malloc(1000000);
    ck_assert(a != NULL);
    memset(a, 'a', 1000000);
    sha256_hex(a, 1000000, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Fed in uneven pieces, the streaming interface gives the same digest. */
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1)
        sha256_update(&c, a + off, off + step > 1000000 ? 1000000 - off : step);
    sha256_final(&c, d);
    ck_assert_uint_eq(d[0], 0xcd);
    ck_assert_uint_eq(d[31], 0xd0);
    free(a);
}
END_TEST

START_TEST(test_sha256_padding_boundaries)
{
    /* Lengths around the 55/56/64-byte padding edges, against sha256sum. */
    static const size_t lens[] = { 55, 56, 57, 63, 64, 65, 119, 120 };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        char buf[128], hex[65], want[65];
        for (size_t i = 0; i < lens[k]; i++)
            buf[i] = (char)('A' + (i * 7 + k) % 26);
        const char *path = tmp_path("sha.bin");
        write_bytes(path, buf, lens[k]);
        sha256_hex(buf, lens[k], hex);
        sha256sum(path, want);
        ck_assert_msg(strcmp(hex, want) == 0, "length %zu: %s, sha256sum %s", lens[k], hex, want);
        unlink(path);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sha256");
    TCase *tc = tcase_create("sha256");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_sha256_known_vectors);
    tcase_add_test(tc, test_sha256_padding_boundaries);
    suite_add_tcase(s, tc);

    /* The padding test runs sha256sum on files in a scratch directory. */
    if (tmpdir_make("test_sha256") != 0) {
        perror("mkdtemp");
        return 1;
    }
    int rc = testutil_run(s);
    tmpdir_remove();
    return rc;
}
