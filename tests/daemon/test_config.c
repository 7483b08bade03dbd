/* Tests daemon/config_table.c: the option table drives defaults, the file and
 * command-line parsers and --help, and etc/resnetd.conf documents every
 * option with its real default. */
#include <check.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/config_table.h"
#include "tests/lib/testutil.h"

static char tmpdir[] = "/tmp/resnetd-test-config-XXXXXX";

static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

static const char *sample_path(void)
{
    static char path[4096];
    const char *src = getenv("RESNETD_SRCDIR");
    snprintf(path, sizeof path, "%s/etc/resnetd.conf", src ? src : ".");
    return path;
}

START_TEST(every_option_has_a_valid_default_and_doc)
{
    int n;
    const config_option *o = config_options(&n);
    ck_assert_int_gt(n, 10);
    config c;
    config_defaults(&c); /* aborts on a bad default */
    for (int i = 0; i < n; i++) {
        ck_assert_msg(o[i].doc && strlen(o[i].doc) > 10, "%s has no doc line", o[i].name);
        char err[256];
        ck_assert_msg(config_set(&c, o[i].name, o[i].def, err, sizeof err) == 0, "%s", err);
    }
    ck_assert_str_eq(c.listen, "127.0.0.1:8080");
    ck_assert_str_eq(c.device, "auto");
    ck_assert_int_eq(c.max_body_bytes, 16L << 20);
    ck_assert_int_eq(c.max_batch_size, CONFIG_AUTO);
}
END_TEST

/* Each option appears in the sample config as "# name = default". Those
 * lines, uncommented, also parse. */
START_TEST(sample_config_documents_every_option_with_its_default)
{
    FILE *f = fopen(sample_path(), "r");
    ck_assert_msg(f != NULL, "cannot open %s", sample_path());
    int n;
    const config_option *o = config_options(&n);
    int *seen = calloc((size_t)n, sizeof *seen);
    char line[1024], uncommented[16384] = "";
    while (fgets(line, sizeof line, f)) {
        char key[128], value[512] = "";
        if (sscanf(line, "# %127[a-z_0-9] = %511[^\n]", key, value) < 1 || !strchr(line, '='))
            continue;
        const config_option *opt = config_find(key);
        if (!opt)
            continue;
        seen[opt - o] = 1;
        if (strcmp(key, "weights") != 0)
            ck_assert_msg(strcmp(value, opt->def) == 0, "sample shows %s = '%s', the default is '%s'", key, value,
                          opt->def);
        strcat(uncommented, line + 2);
    }
    fclose(f);
    for (int i = 0; i < n; i++)
        ck_assert_msg(seen[i], "etc/resnetd.conf does not document '%s'", o[i].name);
    free(seen);
    config c;
    config_defaults(&c);
    char err[512];
    ck_assert_msg(config_load_file(&c, write_tmp("uncommented.conf", uncommented), err, sizeof err) == 0, "%s", err);
    ck_assert_msg(config_validate(&c, err, sizeof err) == 0, "%s", err);
    /* And the sample as shipped loads too. */
    config_defaults(&c);
    ck_assert_msg(config_load_file(&c, sample_path(), err, sizeof err) == 0, "%s", err);
}
END_TEST

START_TEST(file_errors_name_file_line_and_reason)
{
    config c;
    char err[512];
    const char *p = write_tmp("bad.conf", "# comment\n\nmax_batch_size = 0\n");
    config_defaults(&c);
    ck_assert_int_eq(config_load_file(&c, p, err, sizeof err), -1);
    char want[600];
    snprintf(want, sizeof want, "%s:3: max_batch_size: 0 is outside 1..1024", p);
    ck_assert_str_eq(err, want);

    p = write_tmp("unknown.conf", "device = cpu\nmax_batch = 4\n");
    ck_assert_int_eq(config_load_file(&c, p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":2: unknown option 'max_batch'"), "%s", err);

    p = write_tmp("noeq.conf", "device cpu\n");
    ck_assert_int_eq(config_load_file(&c, p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":1: expected 'key = value'"), "%s", err);

    p = write_tmp("baddev.conf", "  device = gpu  # trailing comment\n");
    ck_assert_int_eq(config_load_file(&c, p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":1: 'gpu' is not a device"), "%s", err);

    ck_assert_int_eq(config_load_file(&c, "/nonexistent/resnetd.conf", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/nonexistent/resnetd.conf: "), "%s", err);
}
END_TEST

/* L5: what is not a small regular text file is refused at once, naming it:
 * /dev/zero used to spin forever on NUL-filled lines. */
START_TEST(non_regular_huge_or_binary_config_files_are_refused)
{
    config c;
    char err[512], path[512];
    config_defaults(&c);
    ck_assert_int_eq(config_load_file(&c, "/dev/zero", err, sizeof err), -1);
    ck_assert_str_eq(err, "/dev/zero: not a regular file");
    ck_assert_int_eq(config_load_file(&c, tmpdir, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    snprintf(path, sizeof path, "%s/fifo.conf", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(config_load_file(&c, path, err, sizeof err), -1); /* no writer: must not block */
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);

    snprintf(path, sizeof path, "%s/binary.conf", tmpdir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite("device = cpu\n\0\1\2", 1, 16, f), 16);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(config_load_file(&c, path, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "NUL byte at offset 13"), "%s", err);

    snprintf(path, sizeof path, "%s/huge.conf", tmpdir);
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (long i = 0; i <= CONFIG_FILE_MAX / 10; i++)
        ck_assert_int_eq(fputs("# padding\n", f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(config_load_file(&c, path, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "larger than"), "%s", err);

    /* The text parser alone: no terminating NUL or final newline needed. */
    const char text[] = "device = cpu\nmax_batch_size = 3";
    ck_assert_int_eq(config_parse_text(&c, "mem", text, sizeof text - 1, err, sizeof err), 0);
    ck_assert_int_eq(c.max_batch_size, 3);
    ck_assert_int_eq(config_parse_text(&c, "mem", text, 5, err, sizeof err), -1);
    ck_assert_str_eq(err, "mem:1: expected 'key = value'");
}
END_TEST

START_TEST(values_parse_with_units_auto_and_comments)
{
    config c;
    char err[512];
    config_defaults(&c);
    const char *p = write_tmp("ok.conf", "weights = /w.safetensors   # comment\n"
                                         "max_body_bytes = 1M\n"
                                         "connection_memory_bytes=32k\n"
                                         "max_batch_size = auto\n"
                                         "max_queue_delay_us = 0\n"
                                         "preferred_batch_sizes = 2,4\n");
    ck_assert_msg(config_load_file(&c, p, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.weights, "/w.safetensors");
    ck_assert_int_eq(c.max_body_bytes, 1L << 20);
    ck_assert_int_eq(c.connection_memory_bytes, 32L << 10);
    ck_assert_int_eq(c.max_batch_size, CONFIG_AUTO);
    ck_assert_int_eq(c.max_queue_delay_us, 0);
    ck_assert_int_eq(config_set(&c, "request_timeout_ms", "auto", err, sizeof err), -1); /* no auto here */
    ck_assert_int_eq(config_set(&c, "max_body_bytes", "12X", err, sizeof err), -1);
    ck_assert_int_eq(config_set(&c, "max_body_bytes", "-5", err, sizeof err), -1);
    /* A size that may be auto; a size option without auto refuses it. */
    ck_assert_int_eq(c.gpu_decode_memory, CONFIG_AUTO);
    ck_assert_int_eq(config_set(&c, "gpu_decode_memory", "1G", err, sizeof err), 0);
    ck_assert_int_eq(c.gpu_decode_memory, 1L << 30);
    ck_assert_int_eq(config_set(&c, "gpu_decode_memory", "auto", err, sizeof err), 0);
    ck_assert_int_eq(c.gpu_decode_memory, CONFIG_AUTO);
    ck_assert_int_eq(config_set(&c, "gpu_decode_memory", "8M", err, sizeof err), -1);
    ck_assert_int_eq(config_set(&c, "max_body_bytes", "auto", err, sizeof err), -1);
    ck_assert_int_eq(config_set(&c, "threads", "99999999999999999999", err, sizeof err), -1);
}
END_TEST

START_TEST(flags_override_the_file)
{
    const char *p = write_tmp("over.conf", "weights = /a\nmax_batch_size = 4\ndevice = cpu\n");
    char *argv[] = {
        "resnetd", "--max-batch-size", "16", "--config", (char *)p, "--listen=127.0.0.1:0", "--check-config", NULL
    };
    config c;
    config_cli cli;
    char err[512];
    ck_assert_msg(config_load(&c, &cli, 7, argv, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.max_batch_size, 16); /* flag beats file, whatever the order */
    ck_assert_str_eq(c.device, "cpu"); /* file beats default */
    ck_assert_str_eq(c.weights, "/a");
    ck_assert_str_eq(c.listen, "127.0.0.1:0");
    ck_assert_int_eq(cli.check_config, 1);
    ck_assert_str_eq(cli.config_path, p);
}
END_TEST

START_TEST(bad_flags_are_named)
{
    config c;
    config_cli cli;
    char err[512];
    char *a1[] = { "resnetd", "--max-batch-size", "0", NULL };
    ck_assert_int_eq(config_load(&c, &cli, 3, a1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--max-batch-size: max_batch_size: 0 is outside"), "%s", err);
    char *a2[] = { "resnetd", "--frobnicate=1", NULL };
    ck_assert_int_eq(config_load(&c, &cli, 2, a2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "unknown option '--frobnicate'"), "%s", err);
    char *a3[] = { "resnetd", "--weights", NULL };
    ck_assert_int_eq(config_load(&c, &cli, 2, a3, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--weights needs a value"), "%s", err);
    char *a4[] = { "resnetd", "stray", NULL };
    ck_assert_int_eq(config_load(&c, &cli, 2, a4, err, sizeof err), -1);
    /* Unknown as the last argument: not "needs a value" (issue 39, F7). */
    char *a5[] = { "resnetd", "--weights", "w", "--bogus", NULL };
    ck_assert_int_eq(config_load(&c, &cli, 4, a5, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "unknown option '--bogus'"), "%s", err);
}
END_TEST

START_TEST(validate_requires_weights_and_consistent_batching)
{
    config c;
    char err[512];
    config_defaults(&c);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "weights: required"), "%s", err);
    ck_assert_int_eq(config_set(&c, "weights", "synthetic", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), 0);
    ck_assert_int_eq(config_set(&c, "max_batch_size", "8", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&c, "preferred_batch_sizes", "4,16", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "16 is larger than max_batch_size 8"), "%s", err);
    ck_assert_int_eq(config_set(&c, "preferred_batch_sizes", "4,x", err, sizeof err), -1);
    ck_assert_int_eq(config_set(&c, "preferred_batch_sizes", "4,8", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&c, "queue_capacity", "4", err, sizeof err), 0);
    ck_assert_int_eq(config_validate(&c, err, sizeof err), -1);
}
END_TEST

START_TEST(auto_values_resolve_per_device)
{
    config c;
    config_defaults(&c);
    config_resolve(&c, 0, 2, 0);
    ck_assert_int_eq(c.max_batch_size, 8);
    ck_assert_int_eq(c.max_queue_delay_us, 4000);
    ck_assert_int_eq(c.queue_capacity, 64);
    ck_assert_int_eq(c.threads, 2);
    ck_assert_int_eq(c.body_memory_bytes, 1L << 30); /* memory unknown: 1G */
    config_defaults(&c);
    config_resolve(&c, 1, 1, 128LL << 30);
    ck_assert_int_eq(c.max_batch_size, 128);
    ck_assert_int_eq(c.queue_capacity, 1024);
    ck_assert_int_eq(c.threads, 2);
    ck_assert_int_eq(c.body_memory_bytes, 16L << 30); /* an eighth, at most 16G */
    config_defaults(&c);
    config_resolve(&c, 1, 1, 48LL << 30);
    ck_assert_int_eq(c.body_memory_bytes, 6L << 30);
    config_defaults(&c);
    config_resolve(&c, 0, 1, 2LL << 30); /* a 2G container: a quarter */
    ck_assert_int_eq(c.body_memory_bytes, 512L << 20);
    char err[256];
    config_defaults(&c);
    ck_assert_int_eq(config_set(&c, "max_body_bytes", "800M", err, sizeof err), 0);
    config_resolve(&c, 0, 1, 2LL << 30); /* never under max_body_bytes */
    ck_assert_int_eq(c.body_memory_bytes, 800L << 20);
    config_defaults(&c);
    ck_assert_int_eq(config_set(&c, "max_batch_size", "32", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&c, "body_memory_bytes", "300M", err, sizeof err), 0);
    config_resolve(&c, 0, 8, 4LL << 30);
    ck_assert_int_eq(c.body_memory_bytes, 300L << 20);
    ck_assert_int_eq(c.max_batch_size, 32); /* explicit values stay */
    ck_assert_int_eq(c.queue_capacity, 256);
    ck_assert_int_eq(c.client_connection_limit, 512); /* half of connection_limit */
    config_defaults(&c);
    ck_assert_int_eq(config_set(&c, "connection_limit", "3", err, sizeof err), 0);
    config_resolve(&c, 0, 1, 0);
    ck_assert_int_eq(c.client_connection_limit, 1);
    config_defaults(&c);
    ck_assert_int_eq(config_set(&c, "client_connection_limit", "0", err, sizeof err), 0);
    config_resolve(&c, 0, 1, 0);
    ck_assert_int_eq(c.client_connection_limit, 0); /* no limit stays */
}
END_TEST

START_TEST(listen_addresses_parse)
{
    char host[64], err[256];
    int port;
    ck_assert_int_eq(config_parse_listen("127.0.0.1:8080", host, sizeof host, &port, err, sizeof err), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(port, 8080);
    ck_assert_int_eq(config_parse_listen("[::1]:0", host, sizeof host, &port, err, sizeof err), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 0);
    const char *bad[] = { "localhost", ":80", "::1:80", "[::1]80", "host:", "host:65536", "host:8x" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(config_parse_listen(bad[i], host, sizeof host, &port, err, sizeof err) == -1, "'%s' accepted",
                      bad[i]);
}
END_TEST

START_TEST(help_lists_every_option_as_a_flag)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    config_print_help(f, "resnetd");
    fclose(f);
    int n;
    const config_option *o = config_options(&n);
    for (int i = 0; i < n; i++) {
        char flag[128];
        size_t j = 0;
        for (const char *p = o[i].name; *p; p++)
            flag[j++] = *p == '_' ? '-' : *p;
        flag[j] = '\0';
        char want[160];
        snprintf(want, sizeof want, "--%s=", flag);
        ck_assert_msg(strstr(buf, want), "--help lacks %s", want);
        ck_assert_msg(strstr(buf, o[i].doc), "--help lacks the doc of %s", o[i].name);
    }
    free(buf);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, every_option_has_a_valid_default_and_doc);
    tcase_add_test(tc, sample_config_documents_every_option_with_its_default);
    tcase_add_test(tc, file_errors_name_file_line_and_reason);
    tcase_add_test(tc, non_regular_huge_or_binary_config_files_are_refused);
    tcase_add_test(tc, values_parse_with_units_auto_and_comments);
    tcase_add_test(tc, flags_override_the_file);
    tcase_add_test(tc, bad_flags_are_named);
    tcase_add_test(tc, validate_requires_weights_and_consistent_batching);
    tcase_add_test(tc, auto_values_resolve_per_device);
    tcase_add_test(tc, listen_addresses_parse);
    tcase_add_test(tc, help_lists_every_option_as_a_flag);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    int rc = testutil_run(suite());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
