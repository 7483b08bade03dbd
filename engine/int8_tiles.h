/* The CPU INT8 engine's integer GEMM tiles (engine/engine_cpu_int8.c runs
 * them): each computes int32 sums of im2col rows (bytes, K padded with
 * zeros to a multiple of KBLK) against a panel of int8 weights, exactly;
 * the rows' bytes are u8 (uns: every conv but the stem, engine/int8.h) or
 * int8 (the stem's image). The tiles differ only in the instructions, so
 * every tile gives the same integers (tests/engine/test_engine_int8.c
 * checks it on each tile the CPU has).
 * The AVX512-VNNI, AMX and AVX2 tiles are x86-64 only and take weights
 * repacked as [Kp/4][16][4] per 16 channels ("the VNNI layout"). */
#ifndef RESNETD_INT8_TILES_H
#define RESNETD_INT8_TILES_H

#include <stddef.h>
#include <stdint.h>

#define KBLK 64 /* K padding: the generic tile's inner trip count */
#define MR 4 /* rows per generic tile */
#define NR 4 /* output channels per generic tile */
#define VR 8 /* rows per VNNI tile */
#define CG 32 /* output channels per VNNI and AMX tile */
#define AR 32 /* rows per AMX tile: two 16-row A tiles */

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_VNNI_KERNEL 1
#else
#define HAVE_VNNI_KERNEL 0
#endif
/* AMX intrinsics: GCC 11, clang 12. */
#if HAVE_VNNI_KERNEL && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HAVE_AMX_KERNEL 1
#else
#define HAVE_AMX_KERNEL 0
#endif

/* out[r][j] = sum_k a[r][k] * w[j][k], MR rows (stride lda) by NR weight
 * rows (stride ldw), in plain C that GCC vectorises. */
void int8_dot_tile(const int8_t *restrict a, size_t lda, const int8_t *restrict w, size_t ldw, int Kp, int uns,
                   int32_t out[MR][NR]);

/* Whether this CPU (and, for AMX, the kernel) runs each tile. */
int int8_cpu_has_avx2(void);
int int8_cpu_has_vnni(void);
int int8_cpu_has_amx(void);

#if HAVE_VNNI_KERNEL
/* acc = VR rows of A by CG channels of wv: u8 rows as they are (corr
 * NULL), int8 ones biased by int8_bias_a with corr the channels' 128 *
 * sum_k w. */
void int8_vnni_tile(const int8_t *a, size_t lda, const int8_t *wv, int Kp, const int32_t *corr, int32_t acc[VR][CG]);
/* a ^ 0x80 over n bytes (a multiple of 64, 64-byte aligned). */
void int8_bias_a(int8_t *a, size_t n);
/* 2 rows by 16 channels of 16-bit weights (w16, the VNNI layout widened);
 * out's row stride ldo. */
void int8_avx2_tile(const int8_t *a, size_t lda, const int16_t *w16, int Kp, int uns, int32_t *out, int ldo);
#endif
#if HAVE_AMX_KERNEL
/* The AMX tile configuration on the calling thread, and its release. */
void int8_amx_begin(void);
void int8_amx_end(void);
/* acc = AR rows of A by CG channels of wv. */
void int8_amx_tile(const int8_t *a, size_t lda, const int8_t *wv, int Kp, int uns, int32_t acc[AR][CG]);
#endif

#endif
