// 3x3 convs from an input patch (with its halo) in shared memory, on
// wgmma (sm_90a): one of gpu/conv.cu's kernel families, instantiated by its
// tile table.
#ifndef RESNETD_GPU_CONV_HALO_CUH
#define RESNETD_GPU_CONV_HALO_CUH

#include <type_traits>
#include "gpu/conv_wgmma.cuh"

/* ===================================================================== */
/* 3x3 convs from an input patch in shared memory (sm_90a)              */
/* ===================================================================== */

// As an implicit GEMM, a 3x3 conv reads each input pixel from L2 nine
// times (once per tap), and with 64 output channels each pixel row feeds
// few MACs: layer1 ran at ~230 TFLOP/s, bound by that traffic. Here a CTA
// loads its input patch once and forms the nine taps' tiles from it in
// shared memory.
//
// Output pixels are numbered on a grid as wide as the zero-padded input
// (w + 2 columns, the last two of each row computed and dropped), so that
// output m and tap (r, s) read padded-input pixel m + r * (w + 2) + s: a
// tap's tile is TP consecutive patch rows (one pixel's 64 channels = one
// swizzled row), which one wgmma descriptor addresses. CTAs are persistent
// and load the next tile's patch while this one computes.
//
// The roles are swapped from the implicit GEMM's: the 64 output channels
// are wgmma's M and TP output pixels its N. A (the weights, 64 x 9 ROWB bytes)
// lives in registers for the life of the CTA, loaded once; B is the TP
// patch rows, K-major as stored. Shared memory then feeds only B: 32 MACs
// a byte at FP16 and 64 at INT8. (The first version, pixels as A and the
// weights as B in shared memory, read both: 16 and 32, just what the
// tensor cores need at full rate; it was 10-25% slower.) One warpgroup per
// CTA and two or three CTAs per SM, so that one CTA's epilogue runs under
// another's MMAs. The accumulators hold channels x pixels, so the staging
// tile is written transposed, [pixel][channel]. FP16 stages FP32 sums,
// padded to 68 words a row (the four pixels and eight channels one store
// instruction covers then fall in 32 different banks), and reads the
// residual from global memory, every load of a tile issued before the
// epilogue's barrier. INT8 finishes each value in registers and stages
// bytes: a quarter of the shared-memory traffic, which was the kernel's
// busiest unit (72%). For that, the weights' rows are permuted so that a
// thread's two accumulator rows are adjacent channels (2 bytes a pixel),
// the factors of those two channels stay in registers, and the tile's
// residual slice loads with its patch into the byte tile, where each
// thread reads it and writes its output in place.
//
// Only for 3x3, stride 1, pad 1 (conv_halo_fits), input pixels of ROWB
// bytes (64 FP16 or INT8 channels, or 128 INT8 ones: layer2's, whose 144
// KB of weights fit in two CTAs' registers where FP16's do not), output
// channels a multiple of 64: each CTA computes one 64-channel slice, fixed
// for its life, and the slices' CTAs share the patches through L2; no
// split-K. ROWB 64 (INT8, 64 channels): rows with the 64-byte swizzle
// (chunk c of row r at c ^ ((r >> 1) & 3)), each tap two wgmma k32 steps.
// INT8's epilogue is engine/int8.h's.

// A tile of TP outputs reads TP + 2 (w + 2) + 2 patch rows; the buffers
// hold TP + SWAP_HALO_ROWS (w <= 61). Output offsets are ints.
#define SWAP_HALO_ROWS 128
static int conv_halo_fits(const conv_shape *s, int c)
{
    return s->c == c && s->k % 64 == 0 && s->kh == 3 && s->kw == 3 && s->stride == 1 && s->pad_h == 1 &&
           s->pad_w == 1 && s->oh == s->h && s->ow == s->w && 2 * (s->w + 2) + 2 <= SWAP_HALO_ROWS &&
           (double)s->n * s->h * s->w * s->k < 2147483647.0;
}

// Where 16-byte chunk c of swizzled row r goes, for rows of ROWB bytes.
template <int ROWB>
__device__ __forceinline__ int halo_swz(int r, int c)
{
    return ROWB == 128 ? c ^ (r & 7) : c ^ ((r >> 1) & 3);
}

// A position (y, x) on a grid w wide, stepped forward without a division.
struct grid_pos {
    int y, x;
};

__device__ __forceinline__ grid_pos grid_pos_make(int lin, int w)
{
    grid_pos g;
    g.y = lin / w;
    g.x = lin - g.y * w;
    return g;
}

__device__ __forceinline__ void grid_pos_step(grid_pos &g, int step, int w)
{
    g.x += step;
    while (g.x >= w) {
        g.x -= w;
        g.y++;
    }
}

// Shared memory: two patch buffers, then FP16's staging tile ([TP][SWAP_LDC]
// floats) or INT8's two byte tiles ([TP][64], one a patch buffer).
#define SWAP_LDC 68
#define SWAP_SMEM(S8, TP, ROWB) (2 * ((TP) + SWAP_HALO_ROWS) * (ROWB) + ((S8) ? 2 * (TP)*64 : (TP)*SWAP_LDC * 4) + 1024)

// The output offsets (elements, channel co0) of rows r, r + step, ... of
// a tile of TP padded-grid positions; -1 past the image, in a padding
// column or for a tile past the last.
template <int N>
__device__ __forceinline__ void swap_offsets(const conv_shape &s, int tpi, int TP, int ntiles, int tile, int r,
                                             int step, int co0, int (&o)[N])
{
    const int img = tile / tpi, PW = s.w + 2;
    grid_pos g = grid_pos_make((tile - img * tpi) * TP + r, PW);
#pragma unroll
    for (int k = 0; k < N; k++) {
        o[k] = tile < ntiles && g.y < s.h && g.x < s.w ? ((img * s.h + g.y) * s.w + g.x) * s.k + co0 : -1;
        grid_pos_step(g, step, PW);
    }
}

// Registers (ptxas, CUDA 13.0): ROWB 128 (FP16, or INT8 with 128
// channels) 248 and 244 of 255 at two CTAs per SM (144 hold A, 64 the
// accumulators); INT8 with 64 channels 168 of 168 at three (TP 128), 246
// of 255 at two (TP 256: 128 accumulators); a spill here would put A or
// the accumulators in local memory, so check `-Xptxas -v` after edits.
// The SC instantiation (INT8, 128 channels, the shortcut inside): 255,
// 8 bytes spilled, reloaded three times a tile outside the MMAs' operands.
// INT8's byte tiles: chunk c of pixel p's 64 bytes at c ^ ((p >> 1) & 3),
// so that neither the epilogue's 2-byte stores (four pixels two apart, a
// 16-byte chunk each) nor the 16-byte reads (two pixels in turn) share a
// bank.
//
// SC (INT8, 128 channels: layer2.0.conv2): the block's downsample inside,
// a 1x1 conv of conv_shape.in2 (64 channels) at stride2. Each tile's
// shortcut pixels load with its patch; its sums (the downsample's weights,
// after the taps in each weight row, from shared memory) are finished by
// the downsample's own epilogue (sc_requant2) into the byte tile, where
// the epilogue reads the residual, before the taps' MMAs start.
template <bool S8, int TP, int MINB, int ROWB, bool SC = false>
__global__ void __launch_bounds__(128, MINB)
    conv3x3_swap_kernel(const conv_shape s, const __half *__restrict__ in_, const __half *__restrict__ wgt_,
                        const float *__restrict__ bias, const void *__restrict__ res_, void *__restrict__ out, int relu,
                        float *__restrict__ partial, int kt_per_split, const conv_q8 q)
{
    (void)partial;
    (void)kt_per_split;
#ifdef RESNETD_WGMMA
    static_assert(ROWB == 128 || (S8 && ROWB == 64), "pixel row");
    static_assert(!SC || (S8 && ROWB == 128), "the shortcut: INT8, 128 channels");
    typedef typename acc_type<S8>::type acc_t;
    constexpr int WROW = 9 * ROWB + (SC ? 64 : 0);  // a weight row's bytes (SC: the shortcut's 64 after the taps)
    constexpr int T = 128, CH = ROWB / 16, PROWS = TP + SWAP_HALO_ROWS;
    constexpr int KS = 9 * ROWB / 32, NACC = TP / 2;  // k steps of 32 bytes; accumulators
    constexpr int PER = TP * 8 / T;  // epilogue: 8-channel groups per thread
    constexpr int STEP = T / CH;  // the patch loader's row step
    constexpr int RPT = TP / 32;  // INT8: byte-tile rows per thread (16-byte chunk tid % 4)
    // The swizzled chunk of a row depends on its row bits 0-2 only.
    static_assert(STEP % 8 == 0, "loader step");
    const unsigned char *in = reinterpret_cast<const unsigned char *>(in_);
    const unsigned char *wgt = reinterpret_cast<const unsigned char *>(wgt_);
    const int PW = s.w + 2, HP = s.h * PW;  // the padded output grid of one image
    const int tpi = (HP + TP - 1) / TP, ntiles = s.n * tpi;
    // This CTA's 64 output channels from co0; CTAs cta, cta + nctas, ... of
    // a slice take its tiles (conv_launch makes the grid a multiple of nh).
    const int nh = s.k / 64, co0 = 64 * ((int)blockIdx.x % nh);
    const int cta = (int)blockIdx.x / nh, nctas = (int)gridDim.x / nh;
    const int prows = TP + 2 * PW + 2;
    const int tid = threadIdx.x, lane = tid & 31, wq = tid >> 5;
    const int ch = 16 * wq + (lane >> 2);  // this thread's channels: ch and ch + 8

    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u);
    unsigned char *const patches = smem;  // two buffers of PROWS rows
    float *const cs = reinterpret_cast<float *>(patches + 2 * PROWS * ROWB);  // FP16: [TP][SWAP_LDC]
    unsigned char *const bt = patches + 2 * PROWS * ROWB;  // INT8: [2][TP][64]
    unsigned char *const dsb = bt + 2 * TP * 64;  // SC: [2][TP][64] the shortcut's input pixels
    unsigned char *const dsw = dsb + 2 * TP * 64;  // SC: [64][64] its weights, rows as the accumulators' channels
    const int rq = tid & 3;  // INT8: this thread's chunk of a byte-tile row

    // A thread loads chunk tid % CH of patch rows tid / CH + STEP j: the
    // smem address steps by STEP rows (the same swizzle), the input pixel
    // index by STEP less 2 for each padded row wrapped (the padded grid's
    // rows are 2 wider), with no division or 64-bit multiply per row.
    auto load_patch = [&](int tile, int b) {
        const int img = tile / tpi, m0 = (tile - img * tpi) * TP, c = tid % CH, r0 = tid / CH;
        unsigned char *p = patches + (b * PROWS + r0) * ROWB + (halo_swz<ROWB>(r0, c) << 4);
        const unsigned char *base = in + (size_t)img * s.h * s.w * ROWB + c * 16;
        grid_pos g = grid_pos_make(m0 + r0, PW);  // padded (y, x) = input (y - 1, x - 1)
        int pix = (g.y - 1) * s.w + g.x - 1;
        for (int qr = r0; qr < prows; qr += STEP) {
            const bool v = (unsigned)(g.y - 1) < (unsigned)s.h && (unsigned)(g.x - 1) < (unsigned)s.w;
            cp_async16(p, v ? base + (ptrdiff_t)pix * ROWB : in, v);
            p += STEP * ROWB;
            g.x += STEP;
            pix += STEP;
            while (g.x >= PW) {
                g.x -= PW;
                g.y++;
                pix -= 2;
            }
        }
    };

    // INT8: a tile's residual slice into byte tile b, rows tid / 4 + 32 k
    // (o: their offsets).
    auto load_res = [&](const int(&o)[RPT], int b) {
#pragma unroll
        for (int k = 0; k < RPT; k++) {
            const int r = (tid >> 2) + 32 * k;
            if (o[k] >= 0)
                cp_async16(bt + (b * TP + r) * 64 + ((rq ^ ((r >> 1) & 3)) << 4),
                           static_cast<const unsigned char *>(res_) + o[k] + 16 * rq, true);
        }
    };

    // SC: a tile's shortcut pixels (padded-grid position (y, x) reads in2's
    // (y, x) * stride2; none in the padding columns) into buffer b, rows
    // tid / 4 + 32 k with the 64-byte swizzle.
    auto load_ds = [&](int tile, int b) {
        const int img = tile / tpi, c = tid & 3;
        const unsigned char *base = static_cast<const unsigned char *>(s.in2) + (size_t)img * s.h2 * s.w2 * 64 + c * 16;
        grid_pos g = grid_pos_make((tile - img * tpi) * TP + (tid >> 2), PW);
#pragma unroll
        for (int k = 0; k < RPT; k++) {
            const int r = (tid >> 2) + 32 * k;
            const bool v = g.y < s.h && g.x < s.w;
            cp_async16(dsb + (b * TP + r) * 64 + (halo_swz<64>(r, c) << 4),
                       v ? base + ((size_t)g.y * s.w2 + g.x) * s.stride2 * 64 : base, v);
            grid_pos_step(g, 32, PW);
        }
    };

    // A tile's patch into patch buffer b and (INT8) its residual slice or
    // (SC) its shortcut pixels into buffer b: one cp.async group, empty past
    // the last tile. INT8's offsets of a tile's byte-tile rows are made
    // again for its epilogue: kept in registers, they made the 64-channel
    // kernel spill.
    auto prefetch = [&](int tile, int b) {
        if (tile < ntiles) {
            load_patch(tile, b);
            if constexpr (SC)
                load_ds(tile, b);
            if (S8 && res_) {
                int o8[RPT];
                swap_offsets(s, tpi, TP, ntiles, tile, tid >> 2, 32, co0, o8);
                load_res(o8, b);
            }
            if (!S8 && res_ && (tid & 7) == 0) {  // L2 prefetch of the residual: a pixel's 64 channels a line
                int o[PER];
                swap_offsets(s, tpi, TP, ntiles, tile, tid >> 3, T / 8, co0, o);
#pragma unroll
                for (int k = 0; k < PER; k++)
                    if (o[k] >= 0)
                        prefetch_l2(static_cast<const __half *>(res_) + o[k]);
            }
        }
        cp_async_commit();
    };

    // A fragments: rows ch and ch + 8 of the KRSC weights (one row is an
    // output channel's 9 * ROWB bytes; INT8: channels 16 wq + 2 (lane / 4)
    // and the next), 4 bytes at 32 j + 4 (lane % 4) and 16 bytes further.
    const int c2 = co0 + 16 * wq + 2 * (lane >> 2);  // INT8: this thread's two channels
    uint32_t a[KS][4];
    {
        const unsigned char *w0 = wgt + (size_t)(S8 ? c2 : co0 + ch) * WROW + 4 * (lane & 3),
                            *w8 = w0 + (S8 ? 1 : 8) * WROW;
#pragma unroll
        for (int j = 0; j < KS; j++) {
            a[j][0] = __ldg(reinterpret_cast<const unsigned *>(w0 + 32 * j));
            a[j][1] = __ldg(reinterpret_cast<const unsigned *>(w8 + 32 * j));
            a[j][2] = __ldg(reinterpret_cast<const unsigned *>(w0 + 32 * j + 16));
            a[j][3] = __ldg(reinterpret_cast<const unsigned *>(w8 + 32 * j + 16));
        }
    }
    const float b0 = S8 ? 0.f : bias[co0 + ch], b8 = S8 ? 0.f : bias[co0 + ch + 8];
    const int c = (tid & 7) * 8;  // FP16 epilogue's channels: c..c+7 of the slice
    float2 m2 = {}, bb2 = {};  // INT8: the factors of channels c2, c2 + 1
    if constexpr (S8) {
        m2 = __ldg(reinterpret_cast<const float2 *>(q.mult + c2));
        bb2 = __ldg(reinterpret_cast<const float2 *>(bias + c2));
    }
    // SC: the shortcut's weights, row R of dsw the channel of accumulator
    // row R (as the A fragments above: channels in pairs), in the first
    // patch's group.
    if constexpr (SC)
        for (int k = tid; k < 64 * 4; k += T) {
            const int R = k >> 2, c = k & 3, chn = co0 + 16 * (R >> 4) + 2 * (R & 7) + ((R >> 3) & 1);
            cp_async16(dsw + R * 64 + (halo_swz<64>(R, c) << 4), wgt + (size_t)chn * WROW + 9 * ROWB + c * 16, true);
        }
    // The weights and factors (no kernel's output) load before pdl_sync, the
    // first patch after it, while the weights are still in flight.
    pdl_sync();
    prefetch(cta, 0);

    // The MMAs of the tile in patch buffer b into acc, one wgmma group.
    auto issue_mma = [&](acc_t(&acc)[NACC], int b) {
#pragma unroll
        for (int i = 0; i < NACC; i++)
            acc[i] = 0;
        wgmma_pin(acc);
        wgmma_fence();
        const uint32_t pbase = (uint32_t)__cvta_generic_to_shared(patches + b * PROWS * ROWB);
#pragma unroll
        for (int t = 0; t < 9; t++) {
            // B starts at any patch row, mid swizzle pattern: the swizzle
            // follows the absolute address bits, as the rows were stored,
            // so the descriptor's base offset stays 0 (measured on an H100:
            // base offset (a >> 7) & 7 gave rel L2 1.06).
            const uint32_t pb = pbase + ((t / 3) * PW + t % 3) * ROWB;
            const uint64_t db = ROWB == 64 ? wgmma_desc64(pb) : wgmma_desc(pb);
#pragma unroll
            for (int kk = 0; kk < ROWB / 32; kk++)
                wgmma_rs<TP, acc_t, S8 ? WG_S8U8 : WG_S8S8>::mma(acc, a[t * (ROWB / 32) + kk], db + 2 * kk);
        }
        wgmma_commit();
    };

    // The epilogue of a tile whose sums are in acc, from (INT8) byte tile b.
    auto epilogue = [&](acc_t(&acc)[NACC], int tile, int buf) {
        if constexpr (S8) {
            // Accumulator i: channel c2 + (i / 2) % 2, pixel p = 8 (i / 4) +
            // 2 (lane % 4) + i % 2, whose chunk wq sits at wq ^ (lane % 4).
            // Each pair's residual, the int8.h epilogue, and the output pair
            // in the residual's place.
            unsigned char *const tb = bt + buf * TP * 64 + 128 * (lane & 3) + ((wq ^ (lane & 3)) << 4) +
                                      2 * (lane >> 2);
            // SC: the shortcut's output (int8) is the residual; else res_'s
            // (q.res_u8). The network's case, a ReLU and a u8 residual or
            // the shortcut's or none, has its types fixed at compile time
            // (U): a choice per pair cost the 64-channel kernel two thirds
            // of its time more, its shared-memory loads no longer in flight
            // together.
            const bool hr = SC || res_ != NULL;
            auto finish = [&](auto u) {
                constexpr bool U = decltype(u)::value;
                const int ru = U ? !SC : !SC && q.res_u8, rl = U ? 1 : relu;
#pragma unroll
                for (int j = 0; j < TP / 8; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const uint32_t r = hr ? *reinterpret_cast<const uint16_t *>(tb + 512 * j + 64 * e) : 0u;
                        const int q0 = int8_requant_lo(
                            s8_value(acc[4 * j + e], m2.x, bb2.x, q8_byte(r, 0, ru), q.res_scale, hr), q.out_inv, rl);
                        const int q1 = int8_requant_lo(
                            s8_value(acc[4 * j + 2 + e], m2.y, bb2.y, q8_byte(r, 1, ru), q.res_scale, hr), q.out_inv,
                            rl);
                        *reinterpret_cast<uint16_t *>(tb + 512 * j + 64 * e) = (uint16_t)(U ? u8_pack2(q1, q0, 0)
                                                                                            : q8_pack2(q1, q0, 0, rl));
                    }
            };
            if (relu && (SC || !res_ || q.res_u8))
                finish(std::true_type{});
            else
                finish(std::false_type{});
            int o8[RPT];
            swap_offsets(s, tpi, TP, ntiles, tile, tid >> 2, 32, co0, o8);
            __syncthreads();
#pragma unroll
            for (int k = 0; k < RPT; k++) {
                const int r = (tid >> 2) + 32 * k;
                if (o8[k] >= 0)
                    *reinterpret_cast<uint4 *>(static_cast<int8_t *>(out) + o8[k] + 16 * rq) =
                        *reinterpret_cast<const uint4 *>(bt + (buf * TP + r) * 64 + ((rq ^ ((r >> 1) & 3)) << 4));
            }
        } else {
            // Accumulator i: channel ch (+ 8 for i % 4 >= 2), pixel 8 (i / 4)
            // + 2 (lane % 4) + i % 2; staged + bias as [pixel][channel].
#pragma unroll
            for (int i = 0; i < NACC; i++)
                cs[(8 * (i >> 2) + 2 * (lane & 3) + (i & 1)) * SWAP_LDC + ch + 8 * ((i >> 1) & 1)] =
                    acc[i] + ((i >> 1) & 1 ? b8 : b0);
            // Thread: channels c..c+7 of pixels tid / 8 + 16 k; every residual
            // load issued before the barrier, not one per store (earlier, the
            // loads would not fit in registers beside the accumulators).
            int o[PER];
            uint4 rv[PER];
            swap_offsets(s, tpi, TP, ntiles, tile, tid >> 3, T / 8, co0 + c, o);
#pragma unroll
            for (int k = 0; k < PER; k++) {
                rv[k] = uint4{};
                if (o[k] >= 0 && res_)
                    rv[k] = *reinterpret_cast<const uint4 *>(static_cast<const __half *>(res_) + o[k]);
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < PER; k++) {
                const uint4 r = rv[k];
                if (o[k] >= 0)
                    store8_f16(cs + ((tid >> 3) + k * (T / 8)) * SWAP_LDC + c,
                               res_ ? reinterpret_cast<const __half *>(&r) : NULL, relu,
                               static_cast<__half *>(out) + o[k]);
            }
        }
    };

    int buf = 0;
    for (int tile = cta; tile < ntiles; tile += nctas) {
        // This tile's patch, the one group in flight; the barrier also
        // orders the previous tile's epilogue reads of the staging tile
        // before this tile's writes.
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();
        acc_t acc[NACC];
        if constexpr (SC) {  // the shortcut's sums, finished into byte tile buf as the epilogue's residual
#pragma unroll
            for (int i = 0; i < NACC; i++)
                acc[i] = 0;
            wgmma_pin(acc);
            wgmma_fence();
            const uint64_t da = wgmma_desc64((uint32_t)__cvta_generic_to_shared(dsw)),
                           db = wgmma_desc64((uint32_t)__cvta_generic_to_shared(dsb + buf * TP * 64));
#pragma unroll
            for (int kk = 0; kk < 2; kk++)
                wgmma_op<TP, acc_t, WG_S8U8>::mma(acc, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(acc);
            int8_t *const tb = reinterpret_cast<int8_t *>(bt + buf * TP * 64 + 128 * (lane & 3) +
                                                          ((wq ^ (lane & 3)) << 4) + 2 * (lane >> 2));
            const sc_pair f = sc_pair_load(q, c2, s.k);
#pragma unroll
            for (int j = 0; j < TP / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    sc_requant2(acc[4 * j + e], acc[4 * j + 2 + e], f, q.sc_inv, tb + 512 * j + 64 * e);
        }
        issue_mma(acc, buf);
        // Under the MMAs: the next tile's patch (and residual) into the
        // other buffers, last read by the previous tile's MMAs (waited for
        // before the barrier above) and epilogue.
        prefetch(tile + nctas, buf ^ 1);
        wgmma_wait<0>();
        wgmma_pin(acc);
        epilogue(acc, tile, buf);
        buf ^= 1;
    }
    cp_async_wait<0>();
#else
    (void)s;
    (void)in_;
    (void)wgt_;
    (void)bias;
    (void)res_;
    (void)out;
    (void)relu;
    (void)q;
#endif
}

#endif
