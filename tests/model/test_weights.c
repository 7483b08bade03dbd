/* Tests for model/weights.c: safetensors loading, validation, BN folding,
 * synthetic weights.
 *
 * The test writes its own safetensors files into a mkdtemp directory: the
 * full set of resnet18 tensors with patterned values (to check the fold and
 * the OIHW -> KRSC transpose against a computation done here), and
 * "everything valid except X" variants for each malformed case. Files whose
 * contents do not matter are sparse (header, then ftruncate). The
 * torchvision weights are checked by test_weights_reference.c, util/sha256.c
 * by tests/util/test_sha256.c. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/resnet18.h"
#include "tests/lib/testutil.h"
#include "tests/model/weights_testutil.h"

/* ---- a tiny safetensors writer ------------------------------------------ */

#define MAX_TENSORS 160
typedef struct tspec {
    char name[80];
    char dtype[8];
    int ndim;
    uint64_t shape[4];
    uint64_t begin, end; /* bytes within the data area */
    size_t first; /* index of element 0 in the value array */
} tspec;

typedef struct stf {
    tspec t[MAX_TENSORS];
    int n;
    uint64_t data_len;
    size_t nvals; /* elements in all float tensors */
} stf;

static tspec *stf_add(stf *s, const char *name, const char *dtype, int ndim, uint64_t d0, uint64_t d1, uint64_t d2,
                      uint64_t d3)
{
    ck_assert_int_lt(s->n, MAX_TENSORS);
    tspec *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    uint64_t d[4] = { d0, d1, d2, d3 };
    memcpy(t->shape, d, sizeof d);
    return t;
}

static tspec *stf_find(stf *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0)
            return &s->t[i];
    ck_abort_msg("test bug: no tensor %s", name);
    return NULL;
}

static uint64_t dtype_size(const char *dtype)
{
    return strcmp(dtype, "F32") == 0                                ? 4
           : strcmp(dtype, "I64") == 0 || strcmp(dtype, "F64") == 0 ? 8
           : strcmp(dtype, "U8") == 0                               ? 1
                                                                    : 2;
}

static uint64_t numel(const tspec *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* Packs the tensors back to back in list order, from their dtypes and shapes. */
static void stf_layout(stf *s)
{
    uint64_t off = 0;
    s->nvals = 0;
    for (int i = 0; i < s->n; i++) {
        tspec *t = &s->t[i];
        t->begin = off;
        t->end = off += numel(t) * dtype_size(t->dtype);
        t->first = s->nvals;
        s->nvals += numel(t);
    }
    s->data_len = off;
}

/* Every tensor of torchvision's resnet18 state_dict with a head of
 * `classes`, float ones in dtype, with num_batches_tracked (I64, shape []) as
 * torch writes it. */
static void stf_resnet18(stf *s, const char *dtype, uint64_t classes)
{
    static const char *const bn_fields[4] = { "weight", "bias", "running_mean", "running_var" };
    char name[80];
    s->n = 0;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        snprintf(name, sizeof name, "%s.weight", d->name);
        stf_add(s, name, dtype, 4, (uint64_t)d->cout, (uint64_t)d->cin, (uint64_t)d->k, (uint64_t)d->k);
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "%s.%s", d->bn, bn_fields[j]);
            stf_add(s, name, dtype, 1, (uint64_t)d->cout, 0, 0, 0);
        }
        snprintf(name, sizeof name, "%s.num_batches_tracked", d->bn);
        stf_add(s, name, "I64", 0, 0, 0, 0, 0);
    }
    stf_add(s, "fc.weight", dtype, 2, classes, RESNET18_FEATURES, 0, 0);
    stf_add(s, "fc.bias", dtype, 1, classes, 0, 0, 0);
    stf_layout(s);
}

static json_t *stf_header(const stf *s)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (int i = 0; i < s->n; i++) {
        const tspec *t = &s->t[i];
        json_t *shape = json_array();
        for (int j = 0; j < t->ndim; j++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[j]));
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", t->dtype, "shape", shape, "data_offsets",
                                      (json_int_t)t->begin, (json_int_t)t->end));
    }
    return h;
}

/* Writes the 8-byte length, the header text and data_len bytes of data
 * (zeros, as a sparse file, when data is NULL). Returns the data area's
 * file offset. */
static long write_raw(const char *path, const char *hdr, uint64_t hlen, const uint8_t *data, uint64_t data_len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(hlen >> (8 * i));
    ck_assert(fwrite(len, 1, 8, f) == 8);
    ck_assert(fwrite(hdr, 1, strlen(hdr), f) == strlen(hdr));
    if (data)
        ck_assert(fwrite(data, 1, data_len, f) == data_len);
    ck_assert(fflush(f) == 0);
    ck_assert(ftruncate(fileno(f), (off_t)(8 + strlen(hdr) + data_len)) == 0);
    ck_assert(fclose(f) == 0);
    return (long)(8 + strlen(hdr));
}

/* Writes header json h (stolen) over s's data area; returns the data offset. */
static long write_json(const char *path, json_t *h, uint64_t data_len, const uint8_t *data)
{
    char *text = json_dumps(h, JSON_COMPACT);
    ck_assert(text != NULL);
    long off = write_raw(path, text, strlen(text), data, data_len);
    free(text);
    json_decref(h);
    return off;
}

static long stf_write(const stf *s, const char *path, const uint8_t *data)
{
    return write_json(path, stf_header(s), s->data_len, data);
}

static void poke(const char *path, long off, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    ck_assert(fd >= 0);
    ck_assert(pwrite(fd, bytes, n, off) == (ssize_t)n);
    ck_assert(close(fd) == 0);
}

static void poke_f32(const char *path, long data_off, const tspec *t, uint64_t i, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t b[4] = { (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24) };
    poke(path, data_off + (long)(t->begin + 4 * i), b, 4);
}

/* ---- value encodings, written independently of the loader --------------- */

/* Check's assertions are too slow for per-element loops (each one reports
 * to the parent process), so hot loops count failures and assert once. */

/* v must be zero or a normal binary16 value (stf_encode checks). */
static uint16_t half_bits(float v)
{
    uint16_t h = 0;
    if (v != 0) {
        int e;
        double m = frexp(fabs(v), &e); /* |v| = 2m * 2^(e-1), 2m in [1, 2) */
        h = (uint16_t)((e + 14) << 10 | (int)((2 * m - 1) * 1024));
        if (v < 0)
            h |= 0x8000;
    }
    return h;
}

static uint16_t bf16_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}

/* Patterned values, small multiples of powers of two so that F16 and BF16
 * hold them exactly; running_var stays positive. */
static float *stf_values(const stf *s)
{
    float *v = calloc(s->nvals, sizeof *v);
    ck_assert(v != NULL);
    for (int ti = 0; ti < s->n; ti++) {
        const tspec *t = &s->t[ti];
        const char *dot = strrchr(t->name, '.');
        int conv_weight = t->ndim == 4, fc = strncmp(t->name, "fc.", 3) == 0;
        for (uint64_t i = 0; i < numel(t); i++) {
            float *o = &v[t->first + i];
            if (strcmp(t->dtype, "I64") == 0)
                break;
            if (conv_weight || fc)
                *o = (float)((int)((i * 7 + (uint64_t)ti * 13) % 33) - 16) / (fc ? 128.0f : 64.0f);
            else if (strcmp(dot, ".weight") == 0)
                *o = 0.5f + (float)(i % 5) / 4;
            else if (strcmp(dot, ".bias") == 0)
                *o = (float)((int)(i % 7) - 3) / 8;
            else if (strcmp(dot, ".running_mean") == 0)
                *o = (float)((int)(i % 9) - 4) / 16;
            else
                *o = 0.25f + (float)(i % 6) / 8;
        }
    }
    return v;
}

/* The data area for s holding vals in each tensor's dtype (I64 zeros). */
static uint8_t *stf_encode(const stf *s, const float *vals)
{
    uint8_t *d = calloc(s->data_len + 1, 1);
    ck_assert(d != NULL);
    size_t inexact = 0;
    for (int ti = 0; ti < s->n; ti++) {
        const tspec *t = &s->t[ti];
        int f16 = strcmp(t->dtype, "F16") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
        uint64_t es = dtype_size(t->dtype), n = strcmp(t->dtype, "I64") == 0 ? 0 : numel(t);
        uint8_t *p = d + t->begin;
        for (uint64_t i = 0; i < n; i++) {
            float v = vals[t->first + i];
            uint32_t u;
            memcpy(&u, &v, 4);
            if (f16) {
                u = half_bits(v);
                inexact += half_value((uint16_t)u) != v;
            } else if (bf16) {
                inexact += (u & 0xffff) != 0;
                u = bf16_bits(v);
            }
            for (uint64_t b = 0; b < es; b++)
                *p++ = (uint8_t)(u >> (8 * b));
        }
    }
    ck_assert_msg(inexact == 0, "test bug: %zu values not exact in the file's dtype", inexact);
    return d;
}

/* ---- checking a load ----------------------------------------------------- */

/* Checks every conv, bias and fc value of w against a BN fold and OIHW ->
 * KRSC transpose of vals computed here. */
static void check_fold(const resnet18_weights *w, stf *s, const float *vals)
{
    char name[96];
    for (int ci = 0; ci < RESNET18_NUM_CONVS; ci++) {
        const resnet18_conv_desc *d = &resnet18_convs[ci];
        snprintf(name, sizeof name, "%s.weight", d->name);
        const float *wt = vals + stf_find(s, name)->first;
        const float *bn[4];
        const char *f[4] = { "weight", "bias", "running_mean", "running_var" };
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "%s.%s", d->bn, f[j]);
            bn[j] = vals + stf_find(s, name)->first;
        }
        int K = d->k, C = d->cin;
        for (int o = 0; o < d->cout; o++) {
            double inv_std = 1.0 / sqrt((double)bn[3][o] + 1e-5);
            float b = (float)((double)bn[1][o] - (double)bn[2][o] * bn[0][o] * inv_std);
            if (!near_ulp(w->conv[ci].b[o], b))
                ck_abort_msg("%s bias[%d] = %.9g, expected %.9g", d->bn, o, w->conv[ci].b[o], b);
            for (int c = 0; c < C; c++)
                for (int y = 0; y < K; y++)
                    for (int x = 0; x < K; x++) {
                        float got = w->conv[ci].w[((o * K + y) * K + x) * C + c];
                        float want = (float)(wt[((o * C + c) * K + y) * K + x] * (double)bn[0][o] * inv_std);
                        if (!near_ulp(got, want))
                            ck_abort_msg("%s w[o=%d][y=%d][x=%d][c=%d] = %.9g, expected %.9g", d->name, o, y, x, c, got,
                                         want);
                    }
        }
    }
    const tspec *tw = stf_find(s, "fc.weight");
    ck_assert_int_eq(w->classes, (int)tw->shape[0]);
    const float *fw = vals + tw->first, *fb = vals + stf_find(s, "fc.bias")->first;
    ck_assert(memcmp(w->fc_w, fw, sizeof(float) * (size_t)w->classes * RESNET18_FEATURES) == 0);
    ck_assert(memcmp(w->fc_b, fb, sizeof(float) * (size_t)w->classes) == 0);
}

static int weights_zeroed(const resnet18_weights *w)
{
    resnet18_weights z;
    memset(&z, 0, sizeof z);
    return memcmp(w, &z, sizeof z) == 0;
}

/* Writes every finite 16-bit pattern of dtype F16 (subnormals included) or
 * BF16 into layer2.0.conv1.weight (73728 elements) of the encoded data,
 * and its decoded value into vals. Its BN is made the identity but for eps
 * (gamma = var = 1, beta = mean = 0), so each folded value is one double
 * product rounded once and any conversion error shows. Returns the count. */
static uint64_t put_all_patterns(stf *s, float *vals, uint8_t *data, int f16)
{
    static const char *const bn_fields[4] = { "weight", "bias", "running_mean", "running_var" };
    static const float identity[4] = { 1, 0, 0, 1 };
    char name[64];
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "layer2.0.bn1.%s", bn_fields[j]);
        tspec *t = stf_find(s, name);
        for (uint64_t i = 0; i < numel(t); i++) {
            vals[t->first + i] = identity[j];
            uint32_t u;
            memcpy(&u, &identity[j], 4);
            uint16_t h = f16 ? half_bits(identity[j]) : (uint16_t)(u >> 16);
            data[t->begin + 2 * i] = (uint8_t)h;
            data[t->begin + 2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
    tspec *tw = stf_find(s, "layer2.0.conv1.weight");
    uint64_t n = 0;
    float maxabs = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t expo = f16 ? (h >> 10) & 31 : (h >> 7) & 255;
        if (expo == (f16 ? 31u : 255u))
            continue;
        data[tw->begin + 2 * n] = (uint8_t)h;
        data[tw->begin + 2 * n + 1] = (uint8_t)(h >> 8);
        float *v = &vals[tw->first + n];
        if (f16) {
            *v = (float)half_value((uint16_t)h);
        } else {
            uint32_t u = h << 16;
            memcpy(v, &u, 4);
        }
        maxabs = fmaxf(maxabs, fabsf(*v));
        n++;
    }
    ck_assert_uint_eq(n, f16 ? 63488 : 65280);
    ck_assert_uint_ge(numel(tw), n);
    ck_assert_float_eq(maxabs, f16 ? 65504.0f : 0x1.fep127f);
    return n;
}

/* The first n OIHW elements of layer2.0.conv1, folded by the identity BN,
 * must equal vals * 1/sqrt(1 + eps) exactly. */
static void check_patterns(const resnet18_weights *w, stf *s, const float *vals, uint64_t n)
{
    const int ci = 5, C = 64, K = 3;
    ck_assert_str_eq(resnet18_convs[ci].name, "layer2.0.conv1");
    const float *raw = vals + stf_find(s, "layer2.0.conv1.weight")->first;
    double scale = 1.0 / sqrt(1.0 + 1e-5);
    for (uint64_t i = 0; i < n; i++) {
        int o = (int)(i / (uint64_t)(C * K * K)), c = (int)(i / (K * K) % (uint64_t)C);
        int y = (int)(i / K % K), x = (int)(i % K);
        float got = w->conv[ci].w[((o * K + y) * K + x) * C + c], want = (float)(raw[i] * scale);
        if (got != want)
            ck_abort_msg("pattern %llu: %a, expected %a", (unsigned long long)i, got, want);
    }
}

/* Writes the patterned resnet18 file in dtype (with every 16-bit value for
 * F16 and BF16) and checks its load: the fold, the transpose, the digest. */
static void load_patterned(const char *dtype, uint64_t classes)
{
    stf *s = calloc(1, sizeof *s);
    ck_assert(s != NULL);
    stf_resnet18(s, dtype, classes);
    float *vals = stf_values(s);
    uint8_t *data = stf_encode(s, vals);
    uint64_t npat = 0;
    if (strcmp(dtype, "F32") != 0)
        npat = put_all_patterns(s, vals, data, strcmp(dtype, "F16") == 0);
    const char *path = tmp_path("patterned.safetensors");
    stf_write(s, path, data);

    resnet18_weights w;
    char err[512] = "";
    ck_assert_msg(weights_load(path, &w, err, sizeof err) == 0, "%s", err);
    check_fold(&w, s, vals);
    check_patterns(&w, s, vals, npat);
    char want[65];
    sha256sum(path, want);
    ck_assert_str_eq(w.sha256, want);
    ck_assert_int_eq(w.synthetic, 0);
    weights_free(&w);
    ck_assert(weights_zeroed(&w));
    weights_free(&w); /* freeing twice is harmless */
    unlink(path);
    free(data);
    free(vals);
    free(s);
}

START_TEST(test_f32_file_loads_folded_and_transposed)
{
    load_patterned("F32", RESNET18_IMAGENET_CLASSES);
}
END_TEST

START_TEST(test_f16_file_loads_and_every_finite_f16_converts_exactly)
{
    load_patterned("F16", RESNET18_IMAGENET_CLASSES);
}
END_TEST

START_TEST(test_bf16_file_loads_and_every_finite_bf16_converts_exactly)
{
    load_patterned("BF16", RESNET18_IMAGENET_CLASSES);
}
END_TEST

/* A fine-tuned head: the class count is fc.weight's rows, whatever it is. */
START_TEST(test_class_count_comes_from_fc_weight)
{
    load_patterned("F32", 10);
    load_patterned("BF16", 1);
    load_patterned("F16", 1001);
}
END_TEST

/* ---- malformed files: each gets its own message, none crashes ------------ */

/* Loads path, which must fail with a one-line message naming the file and
 * containing want, leaving w empty. */
static void expect_error(const char *path, const char *want)
{
    resnet18_weights w;
    char err[512] = "";
    memset(&w, 0xab, sizeof w);
    ck_assert_msg(weights_load(path, &w, err, sizeof err) == -1, "%s loaded, expected '%s'", path, want);
    ck_assert_msg(strstr(err, want) != NULL, "error '%s' lacks '%s'", err, want);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "error '%s' does not name %s", err, path);
    ck_assert_msg(strchr(err, '\n') == NULL, "error '%s' is not one line", err);
    ck_assert(weights_zeroed(&w));
    weights_free(&w);
}

/* The zero-filled valid set, as a struct to spoil before writing. */
static stf *valid_set_with_head(uint64_t classes)
{
    stf *s = calloc(1, sizeof *s);
    ck_assert(s != NULL);
    stf_resnet18(s, "F32", classes);
    return s;
}

static stf *valid_set(void)
{
    return valid_set_with_head(RESNET18_IMAGENET_CLASSES);
}

static void expect_stf_error(stf *s, const char *want)
{
    const char *path = tmp_path("bad.safetensors");
    stf_write(s, path, NULL);
    expect_error(path, want);
    unlink(path);
    free(s);
}

static void expect_raw_error(const char *hdr, uint64_t hlen, uint64_t data_len, const char *want)
{
    const char *path = tmp_path("bad.safetensors");
    write_raw(path, hdr, hlen, NULL, data_len);
    expect_error(path, want);
    unlink(path);
}

/* Spoils the header's JSON entry for name with key = value (stolen). */
static void expect_json_error(stf *s, const char *name, const char *key, json_t *value, const char *want)
{
    const char *path = tmp_path("bad.safetensors");
    json_t *h = stf_header(s);
    if (key)
        json_object_set_new(json_object_get(h, name), key, value);
    else
        json_object_set_new(h, name, value);
    write_json(path, h, s->data_len, NULL);
    expect_error(path, want);
    unlink(path);
    free(s);
}

START_TEST(test_zero_filled_valid_set_loads)
{
    /* The base of every "valid except X" case below must itself load. */
    stf *s = valid_set();
    const char *path = tmp_path("zeros.safetensors");
    stf_write(s, path, NULL);
    resnet18_weights w;
    char err[512] = "";
    ck_assert_msg(weights_load(path, &w, err, sizeof err) == 0, "%s", err);
    ck_assert(w.conv[0].w != NULL && w.fc_b != NULL);
    ck_assert_float_eq(w.conv[19].w[0], 0.0f);
    ck_assert_uint_eq(strlen(w.sha256), 64);
    weights_free(&w);
    unlink(path);
    free(s);
}
END_TEST

START_TEST(test_missing_file_is_an_error)
{
    expect_error(tmp_path("no-such.safetensors"), "No such file");
}
END_TEST

START_TEST(test_directory_is_an_error)
{
    expect_error(tmp_dir(), "not a regular file");
}
END_TEST

START_TEST(test_empty_file_is_too_short)
{
    const char *path = tmp_path("empty.safetensors");
    write_bytes(path, "", 0);
    expect_error(path, "too short (0 bytes)");
    unlink(path);
}
END_TEST

START_TEST(test_seven_byte_file_is_too_short)
{
    const char *path = tmp_path("seven.safetensors");
    write_bytes(path, "\x10\0\0\0\0\0\0", 7);
    expect_error(path, "too short (7 bytes)");
    unlink(path);
}
END_TEST

START_TEST(test_header_length_past_eof_is_an_error)
{
    expect_raw_error("{}", 3, 0, "header length 3 runs past the end of the file (10 bytes)");
    expect_raw_error("{\"a\":1}", 1000, 100, "header length 1000 runs past the end");
}
END_TEST

START_TEST(test_huge_header_length_is_an_error)
{
    expect_raw_error("{}", 1ull << 63, 0, "header length 9223372036854775808 runs past the end");
    expect_raw_error("{}", UINT64_MAX, 0, "runs past the end");
}
END_TEST

START_TEST(test_bad_json_is_an_error)
{
    expect_raw_error("{\"conv1.weight\": {\"dtype\": ", 27, 0, "bad JSON header");
    expect_raw_error("", 0, 64, "bad JSON header");
    expect_raw_error("{\"a\": 1, \"a\": 2}", 16, 0, "duplicate");
}
END_TEST

START_TEST(test_json_array_header_is_an_error)
{
    expect_raw_error("[1, 2, 3]", 9, 0, "JSON header is not an object");
}
END_TEST

START_TEST(test_non_object_entry_is_an_error)
{
    expect_json_error(valid_set(), "conv1.weight", NULL, json_integer(5),
                      "tensor conv1.weight: header entry is not a JSON object");
    /* Only __metadata__ itself is exempt. */
    expect_json_error(valid_set(), "__metadata2__", NULL, json_object(), "tensor __metadata2__: dtype missing");
}
END_TEST

START_TEST(test_unknown_dtype_is_an_error)
{
    expect_json_error(valid_set(), "layer1.0.conv2.weight", "dtype", json_string("Q7"),
                      "tensor layer1.0.conv2.weight: unknown dtype Q7");
    expect_json_error(valid_set(), "fc.bias", "dtype", json_integer(4),
                      "tensor fc.bias: dtype missing or not a string");
}
END_TEST

START_TEST(test_integer_or_f64_parameter_is_unsupported)
{
    stf *s = valid_set();
    snprintf(stf_find(s, "bn1.running_var")->dtype, 8, "I64");
    stf_layout(s);
    expect_stf_error(s, "tensor bn1.running_var: unsupported dtype I64");
    s = valid_set();
    snprintf(stf_find(s, "fc.weight")->dtype, 8, "F64");
    stf_layout(s);
    expect_stf_error(s, "tensor fc.weight: unsupported dtype F64");
}
END_TEST

START_TEST(test_offsets_out_of_range_are_an_error)
{
    stf *s = valid_set();
    tspec *t = stf_find(s, "fc.bias");
    t->begin += 4;
    t->end += 4;
    char want[128];
    snprintf(want, sizeof want, "tensor fc.bias: data_offsets [%llu, %llu] out of range (data area is %llu bytes)",
             (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)s->data_len);
    expect_stf_error(s, want);
}
END_TEST

START_TEST(test_begin_after_end_is_an_error)
{
    stf *s = valid_set();
    tspec *t = stf_find(s, "conv1.weight");
    uint64_t b = t->begin;
    t->begin = t->end;
    t->end = b;
    expect_stf_error(s, "tensor conv1.weight: data_offsets [37632, 0] has begin > end");
}
END_TEST

START_TEST(test_overlapping_tensors_are_an_error)
{
    stf *s = valid_set();
    tspec *t = stf_find(s, "layer3.0.bn1.bias");
    t->begin -= 4;
    t->end -= 4;
    expect_stf_error(s, "overlap");
    /* A small tensor moved into the middle of a large one. */
    s = valid_set();
    t = stf_find(s, "layer1.0.bn1.weight");
    tspec *big = stf_find(s, "layer1.0.conv1.weight");
    t->begin = big->begin + 8;
    t->end = t->begin + 256;
    expect_stf_error(s, "tensors layer1.0.conv1.weight");
}
END_TEST

START_TEST(test_size_not_matching_shape_is_an_error)
{
    stf *s = valid_set();
    stf_find(s, "conv1.weight")->shape[3] = 6;
    expect_stf_error(s, "tensor conv1.weight: size mismatch: shape [64, 3, 7, 6] of F32 needs 32256 bytes, "
                        "data_offsets span 37632");
}
END_TEST

START_TEST(test_missing_tensor_is_an_error)
{
    stf *s = valid_set();
    tspec *t = stf_find(s, "layer3.1.bn2.running_var");
    *t = s->t[--s->n];
    expect_stf_error(s, "missing tensor layer3.1.bn2.running_var");
}
END_TEST

START_TEST(test_wrong_shape_is_an_error)
{
    stf *s = valid_set();
    stf_find(s, "fc.weight")->shape[1] = 511;
    stf_layout(s);
    expect_stf_error(s, "tensor fc.weight: wrong shape [1000, 511], expected [classes, 512]");
    s = valid_set();
    tspec *t = stf_find(s, "layer2.0.downsample.0.weight");
    t->ndim = 2; /* [128, 64]: the 1x1 kernel squeezed out */
    stf_layout(s);
    expect_stf_error(s, "tensor layer2.0.downsample.0.weight: wrong shape [128, 64], expected [128, 64, 1, 1]");
}
END_TEST

START_TEST(test_bad_heads_are_errors)
{
    stf *s = valid_set_with_head(10);
    stf_find(s, "fc.bias")->shape[0] = 1000;
    stf_layout(s);
    expect_stf_error(s, "tensor fc.bias: wrong shape [1000], expected [10]");
    s = valid_set_with_head(10);
    tspec *t = stf_find(s, "fc.weight");
    t->ndim = 3;
    t->shape[2] = 1;
    stf_layout(s);
    expect_stf_error(s, "tensor fc.weight: wrong shape [10, 512, 1], expected [classes, 512]");
    expect_stf_error(valid_set_with_head(0), "tensor fc.weight: 0 classes, expected 1 to 100000");
    /* Sparse on disk: the bound is checked before any fc value is read. */
    expect_stf_error(valid_set_with_head(RESNET18_MAX_CLASSES + 1),
                     "tensor fc.weight: 100001 classes, expected 1 to 100000");
}
END_TEST

START_TEST(test_malformed_entry_fields_are_errors)
{
    expect_json_error(valid_set(), "bn1.bias", "shape", json_pack("[i]", -64), "tensor bn1.bias: shape holds");
    expect_json_error(valid_set(), "bn1.bias", "shape", json_string("64"), "tensor bn1.bias: shape missing");
    expect_json_error(valid_set(), "bn1.bias", "data_offsets", json_pack("[i]", 0),
                      "tensor bn1.bias: data_offsets is not");
    expect_json_error(valid_set(), "bn1.bias", "data_offsets", json_pack("[s, i]", "0", 256),
                      "tensor bn1.bias: data_offsets is not");
    expect_json_error(valid_set(), "bn1.bias", "shape", json_pack("[I, I]", (json_int_t)1 << 62, (json_int_t)1 << 62),
                      "tensor bn1.bias: shape is too large");
}
END_TEST

START_TEST(test_extra_tensors_are_ignored_but_checked)
{
    /* Unknown names load (and an empty one may sit anywhere)... */
    stf *s = valid_set();
    stf_add(s, "extra.bytes", "U8", 1, 3, 0, 0, 0);
    stf_add(s, "extra.empty", "F32", 2, 0, 5, 0, 0);
    stf_layout(s);
    stf_find(s, "extra.empty")->begin = stf_find(s, "extra.empty")->end = 100;
    const char *path = tmp_path("extra.safetensors");
    stf_write(s, path, NULL);
    resnet18_weights w;
    char err[512] = "";
    ck_assert_msg(weights_load(path, &w, err, sizeof err) == 0, "%s", err);
    weights_free(&w);
    unlink(path);
    free(s);
    /* ...but their offsets are still validated. */
    s = valid_set();
    tspec *t = stf_add(s, "extra.bytes", "U8", 1, 3, 0, 0, 0);
    t->begin = s->data_len;
    t->end = s->data_len + 3;
    expect_stf_error(s, "tensor extra.bytes: data_offsets");
    s = valid_set();
    t = stf_add(s, "extra.bytes", "U8", 1, 3, 0, 0, 0);
    t->begin = 0;
    t->end = 3;
    expect_stf_error(s, "overlap");
}
END_TEST

/* A zero-filled valid file with one F32 value changed. */
static void expect_value_error(const char *name, uint64_t i, float v, const char *name2, float v2, const char *want)
{
    stf *s = valid_set();
    const char *path = tmp_path("value.safetensors");
    long off = stf_write(s, path, NULL);
    poke_f32(path, off, stf_find(s, name), i, v);
    if (name2)
        poke_f32(path, off, stf_find(s, name2), i, v2);
    expect_error(path, want);
    unlink(path);
    free(s);
}

START_TEST(test_bad_values_are_errors)
{
    expect_value_error("layer2.1.bn1.running_var", 5, -0.5f, NULL, 0,
                       "tensor layer2.1.bn1.running_var: negative running_var -0.5 at index 5");
    expect_value_error("layer4.1.conv2.weight", 77, NAN, NULL, 0,
                       "tensor layer4.1.conv2.weight: non-finite value nan at index 77");
    expect_value_error("bn1.running_mean", 3, -INFINITY, NULL, 0,
                       "tensor bn1.running_mean: non-finite value -inf at index 3");
    expect_value_error("fc.bias", 999, INFINITY, NULL, 0, "tensor fc.bias: non-finite value inf at index 999");
    /* gamma / sqrt(0 + eps) * mean overflows float in the folded bias. */
    expect_value_error("bn1.weight", 2, 3e38f, "bn1.running_mean", 1.0f,
                       "bn1: folded bias overflows float at channel 2");
}
END_TEST

START_TEST(test_f16_inf_and_nan_are_errors)
{
    static const uint16_t bad[3] = { 0x7c00, 0xfc00, 0x7e01 };
    for (int k = 0; k < 3; k++) {
        stf *s = calloc(1, sizeof *s);
        ck_assert(s != NULL);
        stf_resnet18(s, "F16", RESNET18_IMAGENET_CLASSES);
        const char *path = tmp_path("f16bad.safetensors");
        long off = stf_write(s, path, NULL);
        uint8_t b[2] = { (uint8_t)bad[k], (uint8_t)(bad[k] >> 8) };
        poke(path, off + (long)stf_find(s, "layer1.1.conv1.weight")->begin + 2 * 9, b, 2);
        expect_error(path, k == 2 ? "layer1.1.conv1.weight: non-finite value nan at index 9"
                                  : "layer1.1.conv1.weight: non-finite value");
        unlink(path);
        free(s);
    }
}
END_TEST

START_TEST(test_error_message_truncates_safely)
{
    char err[16];
    resnet18_weights w;
    ck_assert_int_eq(weights_load(tmp_path("no-such"), &w, err, sizeof err), -1);
    ck_assert_uint_eq(strlen(err), sizeof err - 1);
    ck_assert_int_eq(weights_load(tmp_path("no-such"), &w, NULL, 0), -1);
}
END_TEST

/* ---- synthetic weights --------------------------------------------------- */

START_TEST(test_synthetic_is_deterministic_and_seeded)
{
    resnet18_weights a, b, c;
    char err[256];
    ck_assert_int_eq(weights_synthetic(42, &a, err, sizeof err), 0);
    ck_assert_int_eq(weights_synthetic(42, &b, err, sizeof err), 0);
    ck_assert_int_eq(weights_synthetic(43, &c, err, sizeof err), 0);
    ck_assert_int_eq(a.synthetic, 1);
    ck_assert_str_eq(a.sha256, "");
    int differ = 0;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        size_t n = (size_t)d->cout * d->k * d->k * d->cin;
        ck_assert(memcmp(a.conv[i].w, b.conv[i].w, n * sizeof(float)) == 0);
        ck_assert(memcmp(a.conv[i].b, b.conv[i].b, (size_t)d->cout * sizeof(float)) == 0);
        differ += memcmp(a.conv[i].w, c.conv[i].w, n * sizeof(float)) != 0;
    }
    ck_assert_int_eq(differ, RESNET18_NUM_CONVS);
    ck_assert_int_eq(a.classes, RESNET18_IMAGENET_CLASSES);
    ck_assert(memcmp(a.fc_w, b.fc_w, sizeof(float) * RESNET18_IMAGENET_CLASSES * RESNET18_FEATURES) == 0);
    ck_assert(memcmp(a.fc_b, c.fc_b, sizeof(float) * RESNET18_IMAGENET_CLASSES) != 0);
    weights_free(&a);
    weights_free(&b);
    weights_free(&c);
}
END_TEST

START_TEST(test_synthetic_has_he_scales)
{
    resnet18_weights w;
    char err[256];
    ck_assert_int_eq(weights_synthetic(7, &w, err, sizeof err), 0);
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        size_t n = (size_t)d->cout * d->k * d->k * d->cin;
        double sum = 0, sq = 0;
        for (size_t j = 0; j < n; j++) {
            sum += w.conv[i].w[j];
            sq += (double)w.conv[i].w[j] * w.conv[i].w[j];
        }
        ck_assert(isfinite(sum) && isfinite(sq));
        double fan_in = (double)d->cin * d->k * d->k, sd = sqrt(sq / n);
        double he = sqrt(2.0 / fan_in);
        /* He scale, or half of it on the convs that add a residual. */
        double want = d->residual == R18_NONE ? he : he / 2;
        ck_assert_msg(fabs(sd / want - 1) < 0.05, "conv %d: std %g, want %g", i, sd, want);
        ck_assert_msg(fabs(sum / n) < 4 * sd / sqrt((double)n), "conv %d: mean %g", i, sum / n);
        int big = 0;
        for (int j = 0; j < d->cout; j++)
            big += !(fabsf(w.conv[i].b[j]) <= 0.1f);
        ck_assert_int_eq(big, 0);
    }
    weights_free(&w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("weights");
    TCase *tc = tcase_create("load");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_f32_file_loads_folded_and_transposed);
    tcase_add_test(tc, test_f16_file_loads_and_every_finite_f16_converts_exactly);
    tcase_add_test(tc, test_bf16_file_loads_and_every_finite_bf16_converts_exactly);
    tcase_add_test(tc, test_class_count_comes_from_fc_weight);
    suite_add_tcase(s, tc);

    tc = tcase_create("malformed");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_zero_filled_valid_set_loads);
    tcase_add_test(tc, test_missing_file_is_an_error);
    tcase_add_test(tc, test_directory_is_an_error);
    tcase_add_test(tc, test_empty_file_is_too_short);
    tcase_add_test(tc, test_seven_byte_file_is_too_short);
    tcase_add_test(tc, test_header_length_past_eof_is_an_error);
    tcase_add_test(tc, test_huge_header_length_is_an_error);
    tcase_add_test(tc, test_bad_json_is_an_error);
    tcase_add_test(tc, test_json_array_header_is_an_error);
    tcase_add_test(tc, test_non_object_entry_is_an_error);
    tcase_add_test(tc, test_unknown_dtype_is_an_error);
    tcase_add_test(tc, test_integer_or_f64_parameter_is_unsupported);
    tcase_add_test(tc, test_offsets_out_of_range_are_an_error);
    tcase_add_test(tc, test_begin_after_end_is_an_error);
    tcase_add_test(tc, test_overlapping_tensors_are_an_error);
    tcase_add_test(tc, test_size_not_matching_shape_is_an_error);
    tcase_add_test(tc, test_missing_tensor_is_an_error);
    tcase_add_test(tc, test_wrong_shape_is_an_error);
    tcase_add_test(tc, test_bad_heads_are_errors);
    tcase_add_test(tc, test_malformed_entry_fields_are_errors);
    tcase_add_test(tc, test_extra_tensors_are_ignored_but_checked);
    tcase_add_test(tc, test_bad_values_are_errors);
    tcase_add_test(tc, test_f16_inf_and_nan_are_errors);
    tcase_add_test(tc, test_error_message_truncates_safely);
    suite_add_tcase(s, tc);

    tc = tcase_create("synthetic");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_synthetic_is_deterministic_and_seeded);
    tcase_add_test(tc, test_synthetic_has_he_scales);
    suite_add_tcase(s, tc);

    if (tmpdir_make("test_weights") != 0) {
        perror("mkdtemp");
        return 1;
    }
    int rc = testutil_run(s);
    tmpdir_remove();
    return rc;
}
