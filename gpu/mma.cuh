// Device helpers shared by the tensor-core kernels (gpu/conv.cu,
// gpu/stem.cu): asynchronous copies, ldmatrix, the mma.sync instructions
// for FP16 and INT8, and engine/int8.h's epilogue of one output.
#ifndef RESNETD_GPU_MMA_CUH
#define RESNETD_GPU_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int bytes = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

// 8 bytes (cp.async.cg takes only 16): the INT8 stem's pixel pairs.
__device__ __forceinline__ void cp_async8(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int bytes = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same fragments read as int8: m16n8k32, exact int32 sums.
__device__ __forceinline__ void mma_16816(int d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A conv's MMA, activations (A) by weights (B): FP16, or INT8 with u8
// activations (each conv but the stem reads a ReLU's output, engine/int8.h).
__device__ __forceinline__ void mma_act(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    mma_16816(d, a, b);
}
__device__ __forceinline__ void mma_act(int d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Accumulators of a kernel instantiated for FP16 or INT8.
template <bool S8>
struct acc_type {
    typedef float type;
};
template <>
struct acc_type<true> {
    typedef int type;
};

// engine/int8.h's epilogue of one output before its ReLU: v = acc * mult +
// bias (+ r * s_r), each step rounded on its own (no FMA), as the CPU
// engine does it. The ReLU is the caller's: int8_requant_lo folds it into
// the quantisation.
__device__ __forceinline__ float s8_value(int acc, float mult, float bias, int r, float res_scale, bool res)
{
    float v = __fadd_rn(__fmul_rn(__int2float_rn(acc), mult), bias);
    if (res)
        v = __fadd_rn(v, __fmul_rn(__int2float_rn(r), res_scale));
    return v;
}

// int8.h's ReLU on a value that stays FP32 (the last conv's output): NaN
// passes, as on the CPU.
__device__ __forceinline__ float s8_relu(float v, int relu)
{
    return relu && v < 0.f ? 0.f : v;
}

#endif
