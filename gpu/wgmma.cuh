// Hopper's warpgroup MMA (wgmma.mma_async), shared by the sm_90a kernels
// (gpu/conv.cu, gpu/stem.cu): descriptors, fences, and the instructions
// for each N, with A in shared memory or in registers.
//
// wgmma exists only in sm_90a code: the compute_90 PTX pass compiles these
// helpers empty, and the kernels that use them must then never be picked
// (conv_init's probe, g_has_wgmma).
#ifndef RESNETD_GPU_WGMMA_CUH
#define RESNETD_GPU_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RESNETD_WGMMA 1
#endif

// A descriptor of K-major tiles without swizzle: 8-row groups of 16-byte
// rows (128 contiguous bytes, a core matrix), lbo bytes between the two
// core matrices of a 32-byte k step, sbo between 8-row groups.
__device__ __forceinline__ uint64_t wgmma_desc_plain(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

// Shared-memory matrix descriptor: start address, leading byte offset
// (unused by swizzled K-major tiles), 1024 bytes between 8-row groups,
// 128-byte swizzle.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// The 64-byte swizzle's descriptor: 512 bytes between 8-row groups.
__device__ __forceinline__ uint64_t wgmma_desc64(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(512 >> 4) << 32) |
           ((uint64_t)2 << 62);
}

__device__ __forceinline__ void wgmma_fence(void)
{
#ifdef RESNETD_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit(void)
{
#ifdef RESNETD_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait(void)
{
#ifdef RESNETD_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// cp.async wrote the tiles through the generic proxy; wgmma reads them
// through the async proxy.
__device__ __forceinline__ void fence_proxy_async_smem(void)
{
#ifdef RESNETD_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma instructions that own them.
template <int R>
__device__ __forceinline__ void wgmma_pin(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

template <int R>
__device__ __forceinline__ void wgmma_pin(int (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+r"(d[i])::"memory");
}

// D[64 x N] += A[64 x 16] * B[N x 16]^T (FP16, FP32 accumulators) or
// A[64 x 32] * B[N x 32]^T (INT8, int32 accumulators), both operands
// K-major in shared memory: 32 bytes of K either way. The operand lists
// are spelled out once per N; the accumulators are the first N/2 operands,
// the descriptors and the scale-d flag the next three.
#define WG_D8(c, i) c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define WG_D32(c, i) WG_D8(c, i), WG_D8(c, i + 8), WG_D8(c, i + 16), WG_D8(c, i + 24)
#define WG_ACC32(c) WG_D32(c, 0)
#define WG_ACC64(c) WG_D32(c, 0), WG_D32(c, 32)
#define WG_ACC128(c) WG_D32(c, 0), WG_D32(c, 32), WG_D32(c, 64), WG_D32(c, 96)
#define WG_REGS32                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64                                                                      \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS128                                                                                 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define F_(x) "+f"(x)
#define R_(x) "+r"(x)

// AB: the INT8 operands' types, A's then B's (WG_S8S8 also for FP16).
enum { WG_S8S8, WG_U8S8, WG_S8U8 };
template <int N, typename T, int AB = WG_S8S8>
struct wgmma_op;

// DA, DB, P: the operand numbers of the descriptors and the flag. FP16
// takes A/B scale and transpose immediates; INT8 has none.
#ifdef RESNETD_WGMMA
#define WGMMA_OP(N, NACC, T, AB, CONSTR, TYPES, IMM, DA, DB, P)                                                       \
    template <>                                                                                                       \
    struct wgmma_op<N, T, AB> {                                                                                       \
        static __device__ __forceinline__ void mma(T (&d)[NACC], uint64_t da, uint64_t db)                            \
        {                                                                                                             \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                              \
                         "wgmma.mma_async.sync.aligned.m64n" #N TYPES " {" WG_REGS##NACC "}, %" DA ", %" DB ", p" IMM \
                                                                                         ";\n}\n"                     \
                         : WG_ACC##NACC(CONSTR)                                                                       \
                         : "l"(da), "l"(db), "r"(1));                                                                 \
        }                                                                                                             \
    };
#else
#define WGMMA_OP(N, NACC, T, AB, CONSTR, TYPES, IMM, DA, DB, P)                            \
    template <>                                                                            \
    struct wgmma_op<N, T, AB> {                                                            \
        static __device__ __forceinline__ void mma(T (&d)[NACC], uint64_t da, uint64_t db) \
        {                                                                                  \
            (void)d;                                                                       \
            (void)da;                                                                      \
            (void)db;                                                                      \
        }                                                                                  \
    };
#endif
WGMMA_OP(64, 32, float, WG_S8S8, F_, "k16.f32.f16.f16", ", 1, 1, 0, 0", "32", "33", "34")
WGMMA_OP(128, 64, float, WG_S8S8, F_, "k16.f32.f16.f16", ", 1, 1, 0, 0", "64", "65", "66")
WGMMA_OP(256, 128, float, WG_S8S8, F_, "k16.f32.f16.f16", ", 1, 1, 0, 0", "128", "129", "130")
WGMMA_OP(64, 32, int, WG_U8S8, R_, "k32.s32.u8.s8", "", "32", "33", "34")
WGMMA_OP(128, 64, int, WG_U8S8, R_, "k32.s32.u8.s8", "", "64", "65", "66")
WGMMA_OP(256, 128, int, WG_U8S8, R_, "k32.s32.u8.s8", "", "128", "129", "130")
WGMMA_OP(64, 32, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "32", "33", "34")
WGMMA_OP(128, 64, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "64", "65", "66")
WGMMA_OP(256, 128, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "128", "129", "130")

// The same with A in registers (wgmma RS): a warp's four A registers are
// the mma.sync m16n8k16 (INT8: m16n8k32) A fragment of its 16 rows; B is
// K-major in shared memory. Operands: the accumulators, A0-A3, B, flag.
template <int N, typename T, int AB = WG_S8S8>
struct wgmma_rs;
#ifdef RESNETD_WGMMA
#define WGMMA_RS(N, NACC, T, AB, CONSTR, TYPES, IMM, A0, A1, A2, A3, DB, P)                           \
    template <>                                                                                       \
    struct wgmma_rs<N, T, AB> {                                                                       \
        static __device__ __forceinline__ void mma(T (&d)[NACC], const uint32_t (&a)[4], uint64_t db) \
        {                                                                                             \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                              \
                         "wgmma.mma_async.sync.aligned.m64n" #N TYPES " {" WG_REGS##NACC              \
                         "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" DB ", p" IMM ";\n}\n"           \
                         : WG_ACC##NACC(CONSTR)                                                       \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));              \
        }                                                                                             \
    };
#else
#define WGMMA_RS(N, NACC, T, AB, CONSTR, TYPES, IMM, A0, A1, A2, A3, DB, P)                           \
    template <>                                                                                       \
    struct wgmma_rs<N, T, AB> {                                                                       \
        static __device__ __forceinline__ void mma(T (&d)[NACC], const uint32_t (&a)[4], uint64_t db) \
        {                                                                                             \
            (void)d;                                                                                  \
            (void)a;                                                                                  \
            (void)db;                                                                                 \
        }                                                                                             \
    };
#endif
WGMMA_RS(64, 32, float, WG_S8S8, F_, "k16.f32.f16.f16", ", 1, 1, 0", "32", "33", "34", "35", "36", "37")
WGMMA_RS(64, 32, int, WG_S8S8, R_, "k32.s32.s8.s8", "", "32", "33", "34", "35", "36", "37")
WGMMA_RS(64, 32, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "32", "33", "34", "35", "36", "37")
WGMMA_RS(128, 64, float, WG_S8S8, F_, "k16.f32.f16.f16", ", 1, 1, 0", "64", "65", "66", "67", "68", "69")
WGMMA_RS(128, 64, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "64", "65", "66", "67", "68", "69")
WGMMA_RS(256, 128, int, WG_S8U8, R_, "k32.s32.s8.u8", "", "128", "129", "130", "131", "132", "133")

#endif
