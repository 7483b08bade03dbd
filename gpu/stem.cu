// ResNet18's stem, the 7x7/2 conv (+ bias, ReLU) and the 3x3/2 max pool
// after it, as one kernel for FP16 and INT8 (model/int8.h, bit for bit).
//
// As an implicit GEMM the stem is the network's worst layer: its 3 input
// channels give K = 147 (padded to 7 x 8 taps x 4 channels), so each row of
// A is gathered from 7 places for little work, and its output, the largest
// tensor of the network, is written only for the max pool to read it back.
// Both precisions took ~0.6 ms at batch 256 on an H100, the max pool
// 0.14-0.19 more.
//
// Here a CTA makes two rows of the pooled output of one image: the 5 stem
// rows they pool (5 x 112 pixels; the first is shared with the CTA above
// and computed twice: 2.5 stem rows per pooled row, 1.25x the 2 needed,
// where one pooled row per CTA took 3, 1.5x) from an input patch of 15
// rows in shared memory, in two passes of 3 and 2 stem rows through a
// ring of 3 stem rows. There is no im2col copy: ldmatrix takes a
// row address per lane, so each lane points straight at its stem pixel's
// 16 bytes of taps in the patch. A 16-byte row must be 16-byte aligned:
// FP16 pixels are 8 bytes and a pixel's first tap is at input column
// 2 * x - 4, so always; INT8 pixels are 4 bytes and odd x would start at
// 8 mod 16, so the INT8 patch is kept twice, the second copy shifted by 8
// bytes, and odd x read from it. The stem outputs (after the epilogue:
// FP16, or int8.h's requantisation) are staged in shared memory and max
// pooled there; only the pooled rows are written.
//
// Geometry (checked by stem_pool_fits): 7x7 stride 2 pad 3, then 3x3
// stride 2 pad 1; input [n][h][w][4] (RGB and a zero, FP16 or int8),
// weights [64][7][8][4] (a zero tap first: taps 0..7 of row r read input
// columns 2x - 4 .. 2x + 3), output [n][ph][pw][64].
#include <stdio.h>
#include "gpu/kernels.cuh"
#include "gpu/mma.cuh"

#define STEM_K 64         // output channels
#define STEM_WARPS 7      // 3 m16 tiles each (3 x 112 = 21 x 16 stem pixels), then 2
#define STEM_MAX_W 224    // stem row width STEM_SW = 112
#define STEM_SW (STEM_MAX_W / 2)
#define STEM_PROWS 15     // input rows under 5 stem rows: 2 * 4 + 7

// Bytes: a pixel, a patch row (the input columns -4 .. w + 3), a weight row
// (+16 bytes so that ldmatrix's 8 rows fall in distinct banks), an output
// pixel (64 channels) and a row of the stem tile (one, + 16 bytes).
template <bool S8>
struct stem_cfg {
    static constexpr int px = S8 ? 4 : 8;
    static constexpr int prow = (STEM_MAX_W + 8) * px + 16;
    static constexpr int copies = S8 ? 2 : 1;
    static constexpr int copy_bytes = STEM_PROWS * prow;
    static constexpr int wrow = 7 * 8 * px + 16;
    static constexpr int orow = STEM_K * (S8 ? 1 : 2);  // an output pixel
    static constexpr int trow = orow + 16;  // rows 8 lanes write at once fall in distinct banks
    // The shifted copy starts 64 bytes into a 128-byte line after the
    // first: an even and an odd pixel 8 bytes apart fall in other banks.
    static constexpr int copy1 = (copy_bytes + 127) / 128 * 128 + 64;
    static constexpr int patch_bytes = S8 ? copy1 + copy_bytes + 16 : copy_bytes;
    static constexpr int w_off = (patch_bytes + 127) / 128 * 128;
    static constexpr int t_off = w_off + STEM_K * wrow;
    static constexpr int smem = t_off + 3 * STEM_SW * trow;
};

// MT m16 tiles per warp of stem pixels from m0 (numbered over the CTA's 5
// stem rows, row-major): the MMAs, then the epilogue (bias and ReLU at
// FP16, int8.h's requantisation at INT8) into the ring of 3 stem rows.
template <bool S8, int MT>
__device__ __forceinline__ void stem_pass(int m0, uint32_t sbase, uint32_t brow, unsigned char *tile,
                                          const float *__restrict__ bias, const conv_q8 &q, int warp, int lane)
{
    typedef stem_cfg<S8> cfg;
    typedef typename acc_type<S8>::type acc_t;
    constexpr int PX = cfg::px, KSTEPS = PX / 4;  // 32-byte k steps per filter row
    constexpr int sw = STEM_SW;
    // This lane's ldmatrix row in each m16 tile: stem pixel m = stem row
    // m / sw, column x = m % sw, whose taps of filter row r start at patch
    // row 2 * (m / sw) + r, column 2x.
    uint32_t arow[MT];
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
        const int m = m0 + (warp * MT + mi) * 16 + (lane & 15), sy = m / sw, x = m - sy * sw;
        const uint32_t copy = S8 && (x & 1) ? cfg::copy1 + 8 : 0;
        arow[mi] = sbase + copy + 2 * sy * cfg::prow + 2 * x * PX + (lane >> 4) * 16;
    }
    acc_t acc[MT][8][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = 0;
#pragma unroll 1
    for (int r = 0; r < 7; r++)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            const uint32_t koff = r * cfg::prow + kk * 32, kw = (r * KSTEPS + kk) * 32;
            uint32_t a[MT][4], b[8][2];
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(a[mi][0]), "=r"(a[mi][1]), "=r"(a[mi][2]), "=r"(a[mi][3])
                             : "r"(arow[mi] + koff));
#pragma unroll
            for (int nj = 0; nj < 4; nj++) {
                uint32_t t[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(t[0]), "=r"(t[1]), "=r"(t[2]), "=r"(t[3])
                             : "r"(brow + nj * 16 * cfg::wrow + kw));
                b[2 * nj][0] = t[0];
                b[2 * nj][1] = t[1];
                b[2 * nj + 1][0] = t[2];
                b[2 * nj + 1][1] = t[3];
            }
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
#pragma unroll
                for (int ni = 0; ni < 8; ni++)
                    mma_16816(acc[mi][ni], a[mi], b[ni]);
        }

    // Row lane / 4 (+ 8) of each tile, channels 2 (lane % 4) + 0, 1; stem
    // row sy goes to ring slot sy % 3.
#pragma unroll
    for (int ni = 0; ni < 8; ni++) {
        const int c = ni * 8 + (lane & 3) * 2;
        const float b0 = bias[c], b1 = bias[c + 1];
        float m0f = 0.f, m1f = 0.f;
        if (S8) {
            m0f = q.mult[c];
            m1f = q.mult[c + 1];
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int m = m0 + (warp * MT + mi) * 16 + (lane >> 2) + 8 * hh;
                unsigned char *dst = tile + (m % (3 * sw)) * cfg::trow + c * (S8 ? 1 : 2);
                if constexpr (S8) {
                    // ReLU'd, so 0..127: no masking before the packing.
                    const int v0 =
                        int8_requant_dev(s8_value(acc[mi][ni][2 * hh], m0f, b0, 0, 0.f, false), q.out_inv, 1);
                    const int v1 =
                        int8_requant_dev(s8_value(acc[mi][ni][2 * hh + 1], m1f, b1, 0, 0.f, false), q.out_inv, 1);
                    *reinterpret_cast<uint16_t *>(dst) = (uint16_t)(v0 | v1 << 8);
                } else {
                    *reinterpret_cast<__half2 *>(dst) = __floats2half2_rn(fmaxf(acc[mi][ni][2 * hh] + b0, 0.f),
                                                                           fmaxf(acc[mi][ni][2 * hh + 1] + b1, 0.f));
                }
            }
    }
}

// The 3x3/2 pool of pooled row py from stem rows first..first + 2 of the
// CTA (ring slots first % 3 ...; the first is outside the image when py =
// 0), columns 2px - 1 .. 2px + 1; 16 bytes of channels per step.
template <bool S8>
__device__ __forceinline__ void stem_pool_row(int first, int py, int pw, const unsigned char *tile,
                                              unsigned char *out, int tid)
{
    typedef stem_cfg<S8> cfg;
    constexpr int VEC = cfg::orow / 16, sw = STEM_SW;
    for (int id = tid; id < pw * VEC; id += STEM_WARPS * 32) {
        const int px = id / VEC, v = id - px * VEC;
        uint4 best = make_uint4(0, 0, 0, 0);
        bool first_seen = true;
        for (int sy = py == 0 ? 1 : 0; sy < 3; sy++)
            for (int x = px == 0 ? 0 : 2 * px - 1; x <= 2 * px + 1 && x < sw; x++) {
                const uint4 t =
                    *reinterpret_cast<const uint4 *>(tile + (((first + sy) % 3) * sw + x) * cfg::trow + v * 16);
                if (first_seen) {
                    best = t;
                    first_seen = false;
                } else if (S8) {
                    best = make_uint4(__vmaxs4(best.x, t.x), __vmaxs4(best.y, t.y), __vmaxs4(best.z, t.z),
                                      __vmaxs4(best.w, t.w));
                } else {
                    __half2 *bh = reinterpret_cast<__half2 *>(&best);
                    const __half2 *th = reinterpret_cast<const __half2 *>(&t);
                    for (int j = 0; j < 4; j++)
                        bh[j] = __hmax2(bh[j], th[j]);
                }
            }
        *reinterpret_cast<uint4 *>(out + (size_t)px * cfg::orow + v * 16) = best;
    }
}

template <bool S8>
__global__ void __launch_bounds__(STEM_WARPS * 32, 2)
    stem_pool_kernel(int h, int w, const void *__restrict__ in_, const void *__restrict__ wgt_,
                     const float *__restrict__ bias, const conv_q8 q, void *__restrict__ out_)
{
    typedef stem_cfg<S8> cfg;
    constexpr int PX = cfg::px;
    const unsigned char *in = static_cast<const unsigned char *>(in_);
    const unsigned char *wgt = static_cast<const unsigned char *>(wgt_);
    const int sh = h / 2, ph = sh / 2, pw = STEM_SW / 2, pairs = (ph + 1) / 2;
    const int img = blockIdx.x / pairs, py = 2 * (blockIdx.x - img * pairs);  // pooled rows py, py + 1
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *const tile = smem + cfg::t_off;  // a ring of 3 stem rows: [3][sw][64]

    // The patch: input rows 4 py - 5 .. 4 py + 9, columns -4 .. w + 3, zero
    // outside the image; 16-byte chunks are whole pixels, in or out as one.
    const int iy0 = 4 * py - 5, prow_px = w + 8;
    const unsigned char *src_img = in + (size_t)img * h * w * PX;
    for (int id = tid; id < STEM_PROWS * prow_px * PX / 16; id += blockDim.x) {
        const int r = id / (prow_px * PX / 16), j = id - r * (prow_px * PX / 16);
        const int iy = iy0 + r, ix = j * 16 / PX - 4;
        const bool v = (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)w;
        cp_async16(smem + r * cfg::prow + j * 16, v ? src_img + ((size_t)iy * w + ix) * PX : in, v);
    }
    if (S8)  // the copy shifted by 8 bytes, in pixel pairs
        for (int id = tid; id < STEM_PROWS * prow_px / 2; id += blockDim.x) {
            const int r = id / (prow_px / 2), j = id - r * (prow_px / 2);
            const int iy = iy0 + r, ix = 2 * j - 4;
            const bool v = (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)w;
            cp_async8(smem + cfg::copy1 + r * cfg::prow + 8 + j * 8, v ? src_img + ((size_t)iy * w + ix) * PX : in,
                      v);
        }
    for (int id = tid; id < STEM_K * 7 * 8 * PX / 16; id += blockDim.x) {
        const int k = id / (7 * 8 * PX / 16), j = id - k * (7 * 8 * PX / 16);
        cp_async16(smem + cfg::w_off + k * cfg::wrow + j * 16, wgt + ((size_t)k * 7 * 8 * PX + j * 16), true);
    }
    cp_async_commit();

    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    // B fragments: weight rows n (ldmatrix x4 gives two n8 tiles).
    const uint32_t brow = sbase + cfg::w_off + (((lane >> 4) * 8 + (lane & 7)) * cfg::wrow) + ((lane >> 3) & 1) * 16;
    unsigned char *out = static_cast<unsigned char *>(out_) + ((size_t)img * ph + py) * pw * cfg::orow;
    cp_async_wait<0>();
    __syncthreads();
    stem_pass<S8, 3>(0, sbase, brow, tile, bias, q, warp, lane);  // stem rows 0-2: slots 0-2
    __syncthreads();
    stem_pool_row<S8>(0, py, pw, tile, out, tid);
    __syncthreads();  // slots 0 and 1 are free
    stem_pass<S8, 2>(3 * STEM_SW, sbase, brow, tile, bias, q, warp, lane);  // stem rows 3, 4: slots 0, 1
    __syncthreads();
    if (py + 1 < ph)
        stem_pool_row<S8>(2, py + 1, pw, tile, out + (size_t)pw * cfg::orow, tid);
}

int stem_pool_fits(int h, int w, int c, int k)
{
    return c == 4 && k == STEM_K && h % 4 == 0 && w % 4 == 0 && h >= 8 && w == STEM_MAX_W;
}

cudaError_t stem_pool_init(void)
{
    cudaError_t e = cudaFuncSetAttribute(stem_pool_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         stem_cfg<false>::smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(stem_pool_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 stem_cfg<true>::smem);
    return e;
}

cudaError_t stem_pool_launch(int kind, int n, int h, int w, const void *in, const void *wgt, const float *bias,
                             const conv_q8 *q, void *out, cudaStream_t st)
{
    if (!stem_pool_fits(h, w, 4, STEM_K) || (kind == CONV_INT8) != (q != NULL) || kind == CONV_FP32)
        return cudaErrorInvalidValue;
    const conv_q8 none = {NULL, 0.f, 0.f, 0};
    const unsigned blocks = (unsigned)(n * ((h / 4 + 1) / 2));  // two pooled rows a CTA
    if (kind == CONV_INT8)
        stem_pool_kernel<true><<<blocks, STEM_WARPS * 32, stem_cfg<true>::smem, st>>>(h, w, in, wgt, bias, *q, out);
    else
        stem_pool_kernel<false><<<blocks, STEM_WARPS * 32, stem_cfg<false>::smem, st>>>(h, w, in, wgt, bias, none,
                                                                                        out);
    return cudaGetLastError();
}
