/* The CPU INT8 engine's integer GEMM tiles (engine/int8_tiles.h): the
 * int32 sums of a block of im2col rows against a panel of weights, one
 * tile per instruction set, all giving the same integers. */
#include <string.h>
#include <unistd.h>
#include "engine/cpu_pool.h"
#include "engine/int8_tiles.h"
#if HAVE_VNNI_KERNEL
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#endif

/* out[r][j] = sum_k a[r][k] * w[j][k] for MR rows (stride lda) and NR
 * weight rows (stride ldw), Kp a multiple of KBLK, A's bytes u8 (uns) or
 * int8. Exact: int32 never overflows for ResNet18's K (see int8.h).
 * Inlined into int8_dot_tile's two branches, so each loop reads one type. */
#define DOT_A(p, k) (uns ? (int)((const uint8_t *)(p))[k] : (int)(p)[k])
static inline __attribute__((always_inline)) void dot_tile(const int8_t *restrict a, size_t lda,
                                                           const int8_t *restrict w, size_t ldw, int Kp, int uns,
                                                           int32_t out[MR][NR])
{
    const int8_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const int8_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
    int32_t s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
    for (int k0 = 0; k0 < Kp; k0 += KBLK)
        for (int k = k0; k < k0 + KBLK; k++) {
            int x0 = DOT_A(a0, k), x1 = DOT_A(a1, k), x2 = DOT_A(a2, k), x3 = DOT_A(a3, k);
            int y0 = w0[k], y1 = w1[k], y2 = w2[k], y3 = w3[k];
            s00 += x0 * y0;
            s01 += x0 * y1;
            s02 += x0 * y2;
            s03 += x0 * y3;
            s10 += x1 * y0;
            s11 += x1 * y1;
            s12 += x1 * y2;
            s13 += x1 * y3;
            s20 += x2 * y0;
            s21 += x2 * y1;
            s22 += x2 * y2;
            s23 += x2 * y3;
            s30 += x3 * y0;
            s31 += x3 * y1;
            s32 += x3 * y2;
            s33 += x3 * y3;
        }
    out[0][0] = s00;
    out[0][1] = s01;
    out[0][2] = s02;
    out[0][3] = s03;
    out[1][0] = s10;
    out[1][1] = s11;
    out[1][2] = s12;
    out[1][3] = s13;
    out[2][0] = s20;
    out[2][1] = s21;
    out[2][2] = s22;
    out[2][3] = s23;
    out[3][0] = s30;
    out[3][1] = s31;
    out[3][2] = s32;
    out[3][3] = s33;
}
#undef DOT_A

CPU_VECTOR_CLONES
void int8_dot_tile(const int8_t *restrict a, size_t lda, const int8_t *restrict w, size_t ldw, int Kp, int uns,
                   int32_t out[MR][NR])
{
    if (uns)
        dot_tile(a, lda, w, ldw, Kp, 1, out);
    else
        dot_tile(a, lda, w, ldw, Kp, 0, out);
}

#if HAVE_VNNI_KERNEL
/* acc[VR][CG] = A[VR][Kp] * W^T for CG channels with AVX512-VNNI: vpdpbusd
 * multiplies unsigned by signed bytes, so u8 rows go in as they are (corr
 * NULL); int8 rows (the stem's) come biased by 128 (a ^ 0x80 is a + 128 as
 * unsigned; int8_bias_a) and 128 * sum_k w[c][k] (corr) is taken off
 * again: the same exact integers as int8_dot_tile. wv is the channel
 * panel's weights as [Kp/4][16][4] per 16 channels, the second 16 at
 * wv + Kp * 16. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void int8_vnni_tile(const int8_t *a, size_t lda,
                                                                           const int8_t *wv, int Kp,
                                                                           const int32_t *corr, int32_t acc[VR][CG])
{
    __m512i s[VR][2];
    for (int r = 0; r < VR; r++)
        s[r][0] = s[r][1] = _mm512_setzero_si512();
    const int8_t *w1 = wv + (size_t)Kp * 16;
    for (int k = 0; k < Kp; k += 4) {
        __m512i b0 = _mm512_load_si512(wv + (size_t)k * 16), b1 = _mm512_load_si512(w1 + (size_t)k * 16);
#pragma GCC unroll 8
        for (int r = 0; r < VR; r++) {
            int32_t x;
            memcpy(&x, a + r * lda + k, 4);
            __m512i av = _mm512_set1_epi32(x);
            s[r][0] = _mm512_dpbusd_epi32(s[r][0], av, b0);
            s[r][1] = _mm512_dpbusd_epi32(s[r][1], av, b1);
        }
    }
    const __m512i zero = _mm512_setzero_si512();
    const __m512i c0 = corr ? _mm512_loadu_si512(corr) : zero, c1 = corr ? _mm512_loadu_si512(corr + 16) : zero;
    for (int r = 0; r < VR; r++) {
        _mm512_storeu_si512(acc[r], _mm512_sub_epi32(s[r][0], c0));
        _mm512_storeu_si512(acc[r] + 16, _mm512_sub_epi32(s[r][1], c1));
    }
}

/* a ^ 0x80 over n bytes (a multiple of 64, a 64-byte aligned): the im2col
 * rows biased once for int8_vnni_tile, not at each of their uses. */
__attribute__((target("avx512f"))) void int8_bias_a(int8_t *a, size_t n)
{
    const __m512i bias = _mm512_set1_epi32((int)0x80808080u);
    for (size_t i = 0; i < n; i += 64)
        _mm512_store_si512(a + i, _mm512_xor_si512(_mm512_load_si512(a + i), bias));
}

#if HAVE_AMX_KERNEL
/* AMX's tile configuration: tmm0-3 the int32 sums of 32 rows x 32
 * channels, tmm4-5 two 16-row A tiles of 64 bytes, tmm6-7 two 16-channel
 * weight panels of 16 rows of 4 bytes a channel (the VNNI layout). */
typedef struct __attribute__((aligned(64))) amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* A constant object: GCC 12 drops stores to a local one before
 * ldtilecfg, whose 64-byte read it does not see. */
static const amx_config amx_cfg = {
    .palette = 1,
    .colsb = { 64, 64, 64, 64, 64, 64, 64, 64 },
    .rows = { 16, 16, 16, 16, 16, 16, 16, 16 },
};

/* Loads the configuration on the calling thread (tile state is per thread). */
__attribute__((target("amx-tile"))) void int8_amx_begin(void)
{
    _tile_loadconfig(&amx_cfg);
}

__attribute__((target("amx-tile"))) void int8_amx_end(void)
{
    _tile_release();
}

/* acc[AR][CG] = A[AR][Kp] * W^T with AMX: tdpbusd multiplies u8 rows
 * (uns) by the signed weights, tdpbssd int8 ones, so neither A's bias nor
 * int8_vnni_tile's correction is needed. wv as for int8_vnni_tile; each
 * 64-byte k step is 16 of its rows. */
__attribute__((target("amx-tile,amx-int8"))) void int8_amx_tile(const int8_t *a, size_t lda, const int8_t *wv, int Kp,
                                                                int uns, int32_t acc[AR][CG])
{
    const int8_t *w1 = wv + (size_t)Kp * 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < Kp; k += 64) {
        _tile_loadd(4, a + k, lda);
        _tile_loadd(5, a + 16 * lda + k, lda);
        _tile_loadd(6, wv + (size_t)k * 16, 64);
        _tile_loadd(7, w1 + (size_t)k * 16, 64);
        if (uns) {
            _tile_dpbusd(0, 4, 6);
            _tile_dpbusd(1, 4, 7);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        } else {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    }
    _tile_stored(0, acc[0], CG * 4);
    _tile_stored(1, acc[0] + 16, CG * 4);
    _tile_stored(2, acc[16], CG * 4);
    _tile_stored(3, acc[16] + 16, CG * 4);
}
#endif

/* out[r][j] (row stride ldo) = A[r][Kp] * W^T for 2 rows and 16 channels
 * with AVX2: vpmaddwd multiplies 16-bit values and adds pairs, exactly
 * (vpmaddubsw on the bytes would saturate: 2 * 255 * 127 > 2^15). A's 4
 * bytes of a k step are widened (u8 or int8, uns) and broadcast; w16 is
 * the 16 channels' weights as [Kp/4][16][4] int16, so one 32-byte row holds
 * 4 channels' 4 values and each sum comes out as two partials, added at
 * the end. The body is inlined into int8_avx2_tile's two branches, so that
 * each loop widens one way. */
__attribute__((target("avx2"), always_inline)) static inline __m256i avx2_widen4(const int8_t *p, int uns)
{
    int32_t x;
    memcpy(&x, p, 4);
    const __m128i v = _mm_cvtsi32_si128(x);
    return _mm256_broadcastq_epi64(uns ? _mm_cvtepu8_epi16(v) : _mm_cvtepi8_epi16(v));
}

__attribute__((target("avx2"), always_inline)) static inline void avx2_tile(const int8_t *a, size_t lda,
                                                                            const int16_t *w16, int Kp, int uns,
                                                                            int32_t *out, int ldo)
{
    /* Eight named accumulators: with an array GCC kept them in memory. */
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00;
    __m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00;
    const int8_t *a1 = a + lda;
    for (int k = 0; k < Kp; k += 4) {
        const __m256i *w = (const __m256i *)(w16 + (size_t)k * 16);
        const __m256i w0 = _mm256_load_si256(w), w1 = _mm256_load_si256(w + 1);
        const __m256i w2 = _mm256_load_si256(w + 2), w3 = _mm256_load_si256(w + 3);
        const __m256i v0 = avx2_widen4(a + k, uns), v1 = avx2_widen4(a1 + k, uns);
        s00 = _mm256_add_epi32(s00, _mm256_madd_epi16(v0, w0));
        s01 = _mm256_add_epi32(s01, _mm256_madd_epi16(v0, w1));
        s02 = _mm256_add_epi32(s02, _mm256_madd_epi16(v0, w2));
        s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(v0, w3));
        s10 = _mm256_add_epi32(s10, _mm256_madd_epi16(v1, w0));
        s11 = _mm256_add_epi32(s11, _mm256_madd_epi16(v1, w1));
        s12 = _mm256_add_epi32(s12, _mm256_madd_epi16(v1, w2));
        s13 = _mm256_add_epi32(s13, _mm256_madd_epi16(v1, w3));
    }
    /* hadd pairs within 128-bit lanes gives channels {0, 1, 4, 5 | 2, 3,
     * 6, 7} of the eight; the permute puts them in order. */
    _mm256_storeu_si256((__m256i *)out, _mm256_permute4x64_epi64(_mm256_hadd_epi32(s00, s01), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s02, s03), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + ldo), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s10, s11), 0xD8));
    _mm256_storeu_si256((__m256i *)(out + ldo + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s12, s13), 0xD8));
}

__attribute__((target("avx2"))) void int8_avx2_tile(const int8_t *a, size_t lda, const int16_t *w16, int Kp, int uns,
                                                    int32_t *out, int ldo)
{
    if (uns)
        avx2_tile(a, lda, w16, Kp, 1, out, ldo);
    else
        avx2_tile(a, lda, w16, Kp, 0, out, ldo);
}
#endif

int int8_cpu_has_avx2(void)
{
#if HAVE_VNNI_KERNEL
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

int int8_cpu_has_vnni(void)
{
#if HAVE_VNNI_KERNEL
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* AMX-INT8 in the CPU (CPUID.7.0:EDX bits 24, 25) and tile data allowed
 * for this process: Linux hands it out on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), and refuses where the
 * kernel or a hypervisor does not support it. */
int int8_cpu_has_amx(void)
{
#if HAVE_AMX_KERNEL && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return 0;
    return int8_cpu_has_vnni() && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}
