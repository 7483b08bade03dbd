/* Tests for the small shared modules: labels, softmax/top-k, .npy I/O and
 * the engine registry's argument parsing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/engine.h"
#include "model/labels.h"
#include "util/npy.h"
#include "engine/topk.h"
#include "tests/lib/testutil.h"

static char tmpdir[] = "/tmp/resnetd-test-util-XXXXXX";

static const char *tmp_write(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

START_TEST(labels_shipped_file_has_1000_names_in_index_order)
{
    labels l;
    char err[256];
    char path[1024];
    snprintf(path, sizeof path, "%s/etc/imagenet-classes.txt",
             getenv("RESNETD_SRCDIR") ? getenv("RESNETD_SRCDIR") : ".");
    ck_assert_msg(labels_load(path, 1000, &l, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(l.count, 1000);
    ck_assert_str_eq(l.names[0], "tench");
    ck_assert_str_eq(l.names[281], "tabby");
    ck_assert_str_eq(l.names[999], "toilet tissue");
    labels_free(&l);
}
END_TEST

START_TEST(labels_wrong_count_empty_line_and_missing_file_are_errors)
{
    labels l;
    char err[256];
    ck_assert_int_ne(labels_load(tmp_write("three.txt", "a\nb\nc\n"), 4, &l, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "has 3 lines, but the model has 4 classes") != NULL, "%s", err);
    ck_assert_int_ne(labels_load(tmp_write("gap.txt", "a\n\nc\n"), 3, &l, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, ":2: empty class name"));
    ck_assert_int_ne(labels_load("/nonexistent/labels.txt", 3, &l, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/labels.txt"));
    /* No trailing newline and CRLF line ends are accepted. */
    ck_assert_msg(labels_load(tmp_write("crlf.txt", "a\r\nb\r\nc"), 3, &l, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(l.names[1], "b");
    ck_assert_str_eq(l.names[2], "c");
    labels_free(&l);
}
END_TEST

START_TEST(topk_is_sorted_softmax_matching_a_direct_computation)
{
    float logits[1000];
    unsigned s = 12345;
    for (int i = 0; i < 1000; i++) {
        s = s * 1103515245u + 12345u;
        logits[i] = (float)((s >> 8) % 20000) / 1000.0f - 10.0f;
    }
    logits[17] = 30.0f;
    logits[400] = 29.5f;
    topk_entry top[5];
    ck_assert_int_eq(topk_softmax(logits, 1000, 5, top), 5);
    ck_assert_int_eq(top[0].index, 17);
    ck_assert_int_eq(top[1].index, 400);
    int ref[5];
    testutil_topk(logits, 1000, 5, ref);
    double sum = 0;
    for (int i = 0; i < 1000; i++)
        sum += exp((double)logits[i] - 30.0);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(top[i].index, ref[i]);
        ck_assert_double_eq_tol(top[i].score, exp((double)logits[ref[i]] - 30.0) / sum, 1e-6);
        if (i)
            ck_assert(top[i].score <= top[i - 1].score);
    }
    /* k is clamped; all k scores sum to 1. */
    topk_entry all[3];
    float three[3] = { 1, 1, 1 };
    ck_assert_int_eq(topk_softmax(three, 3, 10, all), 3);
    ck_assert_int_eq(all[0].index, 0);
    ck_assert_double_eq_tol(all[0].score + all[1].score + all[2].score, 1.0, 1e-6);
}
END_TEST

START_TEST(npy_round_trips_and_rejects_garbage)
{
    float data[2 * 3 * 4];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i * 0.5f - 3.0f;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/a.npy", tmpdir);
    const size_t shape[3] = { 2, 3, 4 };
    ck_assert_msg(npy_write_f32(path, data, 3, shape, err, sizeof err) == 0, "%s", err);
    npy_array a;
    ck_assert_msg(npy_read(path, &a, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(a.dtype, "<f4");
    ck_assert_int_eq(a.ndim, 3);
    ck_assert_int_eq(a.shape[2], 4);
    ck_assert_int_eq(a.count, 24);
    ck_assert_mem_eq(a.data, data, sizeof data);
    npy_free(&a);
    /* The header is 64-byte aligned, as NumPy requires. */
    size_t len;
    uint8_t *raw = testutil_read_file(path, &len);
    ck_assert_ptr_nonnull(raw);
    ck_assert_int_eq((10 + (raw[8] | raw[9] << 8)) % 64, 0);
    free(raw);
    ck_assert_int_ne(npy_read(tmp_write("bad.npy", "not numpy"), &a, err, sizeof err), 0);
}
END_TEST

START_TEST(device_and_precision_names_parse)
{
    engine_device d;
    engine_precision p;
    int idx;
    ck_assert_int_eq(engine_parse_device("cpu", &d, &idx), 0);
    ck_assert_int_eq(d, ENGINE_DEVICE_CPU);
    ck_assert_int_eq(engine_parse_device("cuda:3", &d, &idx), 0);
    ck_assert_int_eq(d, ENGINE_DEVICE_CUDA);
    ck_assert_int_eq(idx, 3);
    ck_assert_int_eq(engine_parse_device("auto", &d, &idx), 0);
    ck_assert_int_ne(engine_parse_device("cuda:", &d, &idx), 0);
    ck_assert_int_ne(engine_parse_device("cuda:x", &d, &idx), 0);
    ck_assert_int_ne(engine_parse_device("gpu", &d, &idx), 0);
    int list[ENGINE_MAX_DEVICES], n;
    ck_assert_int_eq(engine_parse_devices("cuda:0,1,3", &d, list, ENGINE_MAX_DEVICES, &n), 0);
    ck_assert_int_eq(d, ENGINE_DEVICE_CUDA);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(list[0] * 100 + list[1] * 10 + list[2], 13);
    ck_assert_int_eq(engine_parse_devices("cuda:all", &d, list, ENGINE_MAX_DEVICES, &n), 0);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(engine_parse_devices("cuda:2", &d, list, ENGINE_MAX_DEVICES, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(list[0], 2);
    ck_assert_int_eq(engine_parse_devices("cpu", &d, list, ENGINE_MAX_DEVICES, &n), 0);
    ck_assert_int_eq(d, ENGINE_DEVICE_CPU);
    static const char *bad[] = { "cuda:0,0", "cuda:0,",   "cuda:,1",  "cuda:0,,1",
                                 "cuda:0,x", "cuda:1,64", "cpu,cuda", "cuda:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(engine_parse_devices(bad[i], &d, list, ENGINE_MAX_DEVICES, &n) != 0, "%s", bad[i]);
    ck_assert_int_eq(engine_parse_precision("fp16", &p), 0);
    ck_assert_int_eq(p, ENGINE_PRECISION_FP16);
    ck_assert_int_eq(engine_parse_precision("int8", &p), 0);
    ck_assert_int_eq(p, ENGINE_PRECISION_INT8);
    ck_assert_str_eq(engine_precision_name(ENGINE_PRECISION_INT8), "int8");
    ck_assert_int_ne(engine_parse_precision("int4", &p), 0);
    ck_assert_str_eq(engine_device_name(ENGINE_DEVICE_CUDA), "cuda");
    ck_assert_str_eq(engine_precision_name(ENGINE_PRECISION_FP32), "fp32");
}
END_TEST

START_TEST(gpu_tuning_parses_formats_back_and_names_what_is_wrong)
{
    engine_tuning tu;
    char err[256], text[128];
    ck_assert_int_eq(engine_tuning_parse(NULL, &tu, err, sizeof err), 0);
    engine_tuning_format(&tu, text, sizeof text);
    ck_assert_str_eq(text, "");
    ck_assert_int_eq(
        engine_tuning_parse("pdl=off,stem=separate,autotune=log,downsample=inside,pool=separate", &tu, err, sizeof err),
        0);
    ck_assert_int_eq(tu.pdl, ENGINE_TUNE_OFF);
    ck_assert_int_eq(tu.stem, ENGINE_TUNE_SEPARATE);
    ck_assert_int_eq(tu.autotune, ENGINE_TUNE_LOG);
    ck_assert_int_eq(tu.downsample, ENGINE_TUNE_INSIDE);
    ck_assert_int_eq(tu.pool, ENGINE_TUNE_SEPARATE);
    engine_tuning_format(&tu, text, sizeof text);
    ck_assert_str_eq(text, "autotune=log,stem=separate,pool=separate,downsample=inside,pdl=off");
    /* A later key wins; auto resets one. */
    ck_assert_int_eq(engine_tuning_parse("pdl=on,pdl=auto", &tu, err, sizeof err), 0);
    ck_assert_int_eq(tu.pdl, ENGINE_TUNE_AUTO);
    static const char *bad[] = { "pdl",        "pdl=",       "=on",
                                 "pdl=inside", "stem=fused", "speed=max",
                                 "pdl=on,",    "autotune=0", "pool=separate;stem=separate" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(engine_tuning_parse(bad[i], &tu, err, sizeof err) != 0, "%s", bad[i]);
        ck_assert_msg(strstr(err, "gpu tuning"), "%s: %s", bad[i], err);
    }
}
END_TEST

START_TEST(resnet18_has_1_82_gmac_per_image)
{
    ck_assert_double_eq_tol(resnet18_macs_per_image(1000) / 1e9, 1.82, 0.01);
    /* The head is 512 MACs a class. */
    ck_assert_double_eq_tol(resnet18_macs_per_image(1000) - resnet18_macs_per_image(10), 990.0 * 512, 1e-6);
}
END_TEST

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, labels_shipped_file_has_1000_names_in_index_order);
    tcase_add_test(tc, labels_wrong_count_empty_line_and_missing_file_are_errors);
    tcase_add_test(tc, topk_is_sorted_softmax_matching_a_direct_computation);
    tcase_add_test(tc, npy_round_trips_and_rejects_garbage);
    tcase_add_test(tc, device_and_precision_names_parse);
    tcase_add_test(tc, gpu_tuning_parses_formats_back_and_names_what_is_wrong);
    tcase_add_test(tc, resnet18_has_1_82_gmac_per_image);
    suite_add_tcase(s, tc);
    int rc = testutil_run(s);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
