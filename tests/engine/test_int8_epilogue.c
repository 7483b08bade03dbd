/* Tests the CPU INT8 engine's vector epilogues (engine/engine_cpu_int8.c:
 * epilogue_avx512 on AVX-512, epilogue_avx2) against its scalar epilogue(),
 * which is engine/int8.h written out: byte for byte on int8 outputs and
 * bit for bit on the last conv's FP32 output, on random sums, factors,
 * biases and residuals with NaN, +-inf, +-0, subnormal and huge values
 * mixed in. The engine feeds them finite values only, so these paths are
 * reachable here alone. The engine's file is included whole: the
 * epilogues are static. */
#include "engine/engine_cpu_int8.c"

#include <check.h>
#include <math.h>
#include "tests/lib/testutil.h"

#define TRIALS 20000
#define MAXC 512 /* channels of the largest conv output */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint32_t next_u32(void)
{
    return testutil_rand_u32(&rng);
}

/* A float that is ordinary most of the time and special now and then. */
static float any_float(float typical)
{
    switch (next_u32() % 16) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 0.0f;
    case 4: return -0.0f;
    case 5: return 1e-42f;
    case 6: return 3e38f;
    default: return typical * ((float)(next_u32() % 20001) / 10000.0f - 1.0f);
    }
}

/* A positive inverse scale as calib_conv_params makes them: finite, or
 * +inf for a subnormal scale. */
static float any_inv(void)
{
    switch (next_u32() % 8) {
    case 0: return INFINITY;
    case 1: return 3e38f;
    default: return 1.0f / (0.001f + (float)(next_u32() % 1000) / 100.0f);
    }
}

/* Runs each epilogue on the same inputs and compares what they wrote. */
static void compare(int layer, int with_res, int (*have)(void),
                    void (*fast)(i8_engine *, const i8_layer *, int, int, int, int32_t (*)[CG]), const char *what)
{
    if (!have()) {
        fprintf(stderr, "%s: this CPU lacks it, not tested\n", what);
        return;
    }
    static i8_engine e;
    static int8_t res8[VR * MAXC], out_ref[VR * MAXC], out_fast[VR * MAXC];
    static float last_ref[VR * MAXC], last_fast[VR * MAXC], mult[MAXC], bias[MAXC];
    static int32_t acc[VR][CG];
    const int n = resnet18_convs[layer].cout;
    i8_layer *L = &e.layer[layer];
    L->d = &resnet18_convs[layer];
    L->mult = mult;
    L->b = bias;
    L->res = with_res ? R18_T_POOL : -1;
    e.buf[R18_T_POOL] = 0;
    e.buf[layer] = 1;
    e.act[0] = res8;
    for (int t = 0; t < TRIALS; t++) {
        for (int c = 0; c < n; c++) {
            mult[c] = any_float(1e-3f);
            bias[c] = any_float(2.0f);
        }
        L->res_scale = any_float(0.05f);
        L->out_inv = any_inv();
        for (int i = 0; i < VR * MAXC; i++)
            res8[i] = (int8_t)(next_u32() % 255 - 127);
        const int rows = 1 + (int)(next_u32() % VR), c0 = (int)(next_u32() % (n / CG)) * CG;
        for (int r = 0; r < VR; r++)
            for (int c = 0; c < CG; c++)
                acc[r][c] = next_u32() % 4 == 0 ? 0 : (int32_t)(next_u32() % 2000001) - 1000000;
        /* The scalar reference and the fast epilogue, each into its own buffers. */
        e.act[1] = out_ref;
        e.last = last_ref;
        memset(out_ref, 0x55, sizeof out_ref);
        memset(last_ref, 0x55, sizeof last_ref);
        epilogue(&e, L, 0, rows, c0, CG, acc[0], CG);
        e.act[1] = out_fast;
        e.last = last_fast;
        memset(out_fast, 0x55, sizeof out_fast);
        memset(last_fast, 0x55, sizeof last_fast);
        fast(&e, L, 0, rows, c0, acc);
        ck_assert_msg(memcmp(out_ref, out_fast, sizeof out_ref) == 0 &&
                          memcmp(last_ref, last_fast, sizeof last_ref) == 0,
                      "%s, conv %s, residual %d: trial %d differs from epilogue()", what, L->d->name, with_res, t);
    }
}

#if HAVE_VNNI_KERNEL
static int have_avx512(void)
{
    return int8_cpu_has_vnni();
}
#endif

/* Conv indices: one with an int8 output and a ReLU, one without a ReLU
 * (a downsample), and the last (FP32 output). */
static int conv_of(int kind)
{
    if (kind == 0)
        return 1;
    if (kind == 2)
        return LAST;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++)
        if (!resnet18_convs[i].relu)
            return i;
    return 1;
}

START_TEST(vector_epilogues_equal_the_scalar_one)
{
    const int layer = conv_of(_i / 2), with_res = _i % 2;
#if HAVE_VNNI_KERNEL
    compare(layer, with_res, have_avx512, epilogue_avx512, "epilogue_avx512 (AVX-512)");
    compare(layer, with_res, int8_cpu_has_avx2, epilogue_avx2, "epilogue_avx2");
#else
    (void)layer;
    (void)with_res;
    (void)compare;
    fprintf(stderr, "no x86-64 vector epilogues in this build\n");
#endif
}
END_TEST

static Suite *int8_epilogue_suite(void)
{
    Suite *s = suite_create("int8_epilogue");
    TCase *tc = tcase_create("epilogue");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, vector_epilogues_equal_the_scalar_one, 0, 6);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return testutil_run(int8_epilogue_suite());
}
