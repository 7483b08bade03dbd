// ResNet18's stem, the 7x7/2 conv (+ bias, ReLU) and the 3x3/2 max pool
// after it, as one kernel for FP16 and INT8 (engine/int8.h, bit for bit).
//
// As an implicit GEMM the stem is the network's worst layer: its 3 input
// channels give K = 147 (padded to 7 x 8 taps x 4 channels), so each row of
// A is gathered from 7 places for little work, and its output, the largest
// tensor of the network, is written only for the max pool to read it back.
// Both precisions took ~0.6 ms at batch 256 on an H100, the max pool
// 0.14-0.19 more.
//
// Here a CTA makes two rows of the pooled output of one image at a time
// (an item; the CTAs are persistent and take a run of consecutive items):
// the 5 stem rows they pool (5 x 112 pixels) from an input patch of 15
// rows in shared memory. The first stem row and the first 7 input rows are
// the item above's last, which the CTA made just before unless the item
// starts its run or its image: those it keeps (a ring of patch rows, and
// the row's sums in shared memory), so that in a run it computes 2 stem
// rows per pooled row, and fills 8 input rows of 15. The passes are of 2
// stem rows (and row 0 alone where not kept; INT8's wgmma kernel: rows 3
// and 4 one by one), row 2's sums kept for the second pooled row (in
// shared memory; INT8's wgmma kernel: in registers). There is no im2col
// copy:
// ldmatrix takes a row address per lane, so each lane points straight at
// its stem pixel's 16 bytes of taps in the patch. A 16-byte row must be
// 16-byte aligned: FP16 pixels are 8 bytes and a pixel's first tap is at
// input column 2 * x - 4, so always; INT8 pixels are 4 bytes and odd x
// would start at 8 mod 16, so the INT8 patch is kept twice, the second
// copy shifted by 8 bytes, and odd x read from it. Each warp owns 16 stem
// columns in every row, so the max pool runs on the accumulators: down
// the rows in registers, across the columns in registers too, as each
// thread's two accumulator rows are made adjacent columns (one shuffle
// brings the third); the epilogue
// (FP16 or int8.h's requantisation) then runs on the pooled values only,
// a quarter of the stem's, which the pool may take first because the
// epilogue is non-decreasing (stem_pool_out).
//
// The MMAs: mma.sync (m16n8k16, INT8 m16n8k32) with 7 warps, or on sm_90a
// wgmma m64n64 with 8 warps, two warpgroups of 64 columns (stem_mma_wg):
// the same ldmatrix A fragments, passed in registers, and the weights read
// by wgmma from shared memory, where mma.sync had every warp load all 64
// channels' B fragments for each k step. Passes of at most 2 rows, 64
// accumulators a thread beside the wgmma's operands: two CTAs an SM leave
// 128 registers.
//
// The stem also does the input's normalisation: the CTA writes its patch
// from the decoded RGB rows (3 bytes a pixel) through the normalisation's
// table (INT8: quantised; FP16: the halves normalize_launch writes). A
// separate kernel wrote the 4- or 8-byte pixels to memory (51 or 103 MB
// at batch 256) for the stem to read back, 0.08 ms on an H100. The CTAs
// are persistent and load the next item's rows under this item's MMAs:
// INT8 into a second buffer; FP16's patch is twice the size, so a second
// buffer would not fit at two CTAs an SM, and its one buffer refills once
// the patch is filled. Images that came as FP32 tensors are normalised
// into `in` by place_f32(_s8) and read from there (stem_rgb.which).
//
// Geometry (checked by stem_pool_fits): 7x7 stride 2 pad 3, then 3x3
// stride 2 pad 1; input the decoded [n][h][w][3] bytes, and for FP32
// images [n][h][w][4] (RGB and a zero, FP16 or int8),
// weights [64][7][8][4] (a zero tap first: taps 0..7 of row r read input
// columns 2x - 4 .. 2x + 3), output [n][ph][pw][64].
#include <stdio.h>
#include <atomic>
#include <type_traits>
#include "gpu/kernels.cuh"
#include "gpu/mma.cuh"
#include "gpu/wgmma.cuh"

#define STEM_K 64  // output channels
#define STEM_MAX_W 224  // stem row width STEM_SW = 112
#define STEM_SW (STEM_MAX_W / 2)
#define STEM_PROWS 15  // input rows under 5 stem rows: 2 * 4 + 7
// The patch's rows in shared memory: a ring, where an item's row p lies in
// slot p ^ base, base = 0 or 8 (stem_ring_base), so that an item after
// the one above it (pooled rows py + 2, its patch 8 input rows further
// down) finds its first 7 rows where the last one left them and fills
// only 8.
#define STEM_RING 16
#define STEM_KEEP 7  // patch rows an item shares with the one above

// Bytes: a pixel, a patch row (the input columns -4 .. w + 3), a weight row
// (+16 bytes so that ldmatrix's 8 rows fall in distinct banks) and an
// output pixel (64 channels).
template <bool S8, bool WG>
struct stem_cfg {
    // Warps of 16 stem columns each: 7 x 16 = 112 (mma.sync), or two
    // warpgroups (wgmma), the last warp's columns past the row.
    static constexpr int warps = WG ? 8 : 7;
    static constexpr int threads = warps * 32;
    static constexpr int px = S8 ? 4 : 8;
    static constexpr int ksteps = 7 * px / 4;  // 32-byte k steps of the 7 filter rows
    static constexpr int prow = (STEM_MAX_W + 8) * px + 16;
    static constexpr int copy_bytes = STEM_RING * prow;
    static constexpr int wrow = 7 * 8 * px + 16;
    static constexpr int orow = STEM_K * (S8 ? 1 : 2);  // an output pixel
    // A staged pooled pixel, +16 bytes: the 8 pixels one store of a warp
    // writes fall in distinct 16-byte bank groups.
    static constexpr int srow = orow + 16;
    // The shifted copy starts 64 bytes into a 128-byte line after the
    // first (any 16-byte multiple would do now: no ldmatrix group reads
    // both copies, stem_mma).
    static constexpr int copy1 = (copy_bytes + 127) / 128 * 128 + 64;
    static constexpr int patch_bytes = S8 ? copy1 + copy_bytes + 16 : copy_bytes;
    // Raw RGB rows: INT8 (persistent CTAs) two buffers, the next item's
    // loading under this one's MMAs; FP16 one. The normalisation's table:
    // [3][256] words, each value where it goes in a pixel's first word
    // (INT8: channel c's byte at bits 8c; FP16: R and G's halves in the
    // first word, B's in the second).
    static constexpr int raw_row = STEM_MAX_W * 3;
    static constexpr int raw_bytes = (STEM_PROWS * raw_row + 127) / 128 * 128;
    static constexpr int raw_off = (patch_bytes + 127) / 128 * 128;
    static constexpr int lut_off = raw_off + (S8 ? 2 : 1) * raw_bytes;
    static constexpr int w_off = lut_off + 3 * 256 * 4;
    // The weights: [64][wrow], or for wgmma a 2048-byte B tile a k step,
    // [2 core matrices in k][8 groups of 8 channels][8][16 bytes].
    static constexpr int w_bytes = WG ? ksteps * 2048 : STEM_K * wrow;
    static constexpr int x_off = w_off + w_bytes;  // the warps' last columns, [warps][64] sums
    static constexpr int s_off = x_off + warps * STEM_K * 4;  // a pooled row, [56][srow]
    static constexpr int k_off = s_off + STEM_SW / 2 * srow;  // kept stem row sums, [32][threads]
    static constexpr int f_off = k_off + 32 * threads * 4;  // bias, then INT8's multipliers: [2][64] floats
    static constexpr int smem = f_off + 2 * STEM_K * 4;
    // Two CTAs an SM (__launch_bounds__ below), each with the 1 KB the
    // driver reserves, in the SM's 228 KB.
    static_assert(2 * (smem + 1024) <= 228 * 1024, "two CTAs an SM");
};

// Whether a thread's first accumulator row (e < 2) is the odd one of its
// two stem columns (i = lane / 4; see stem_mma).
template <bool S8>
__device__ __forceinline__ int stem_flip(int i)
{
    return S8 ? 0 : i >> 2;
}

// The ring slot of an item's patch row p is p ^ base (STEM_RING): the
// item with pooled rows py, py + 1 (py even) starts at input row 4 py - 5,
// in slot (4 py + p) mod 16.
__device__ __forceinline__ int stem_ring_base(int py)
{
    return (py & 2) << 2;
}

// A patch row's address from stem_a_rows' two bases: pr < 8 in slot pr +
// base, else pr - base (pr ^ base for base 0 or 8). In the wgmma kernels'
// unrolled loops pr is known at compile time, so that this is an
// immediate offset; mma.sync's filter-row loop, not unrolled (for its
// registers), takes it once a tile and steps it (stem_mma).
template <bool S8>
__device__ __forceinline__ uint32_t stem_row_addr(uint32_t lo, uint32_t hi, int pr)
{
    return (pr < 8 ? lo : hi) + pr * stem_cfg<S8, false>::prow;
}

// This lane's ldmatrix row addresses (stem_row_addr's lo and hi; the
// item's ring base) at its stem column of the 16 from 16 w16, and MT
// tiles' accumulators zeroed. Rows i and i + 8 of each m16 tile (a
// thread's two accumulator rows) are stem columns 2 i and 2 i + 1, so
// that the pool takes them together (stem_pool_out). INT8: row i is the
// even one, so each ldmatrix 8-row group reads 128 bytes of one copy.
// FP16 (8-byte pixels): for i >= 4 row i is the odd one (stem_flip), so
// that a group's 8 rows fall in 8 distinct 16-byte bank groups; all even,
// they were 2-way conflicts. Column x's taps of filter row r of stem row
// sy start at patch row 2 sy + r, column 2x.
template <bool S8, int MT>
__device__ __forceinline__ void stem_a_rows(int base, uint32_t sbase, int w16, int lane, uint32_t &lo, uint32_t &hi,
                                            typename acc_type<S8>::type (&acc)[MT][32])
{
    typedef stem_cfg<S8, false> cfg;  // the patch is the same for both kernels
    const int m = lane & 15, i = m & 7, x = 16 * w16 + 2 * i + ((m >> 3) ^ stem_flip<S8>(i));
    const uint32_t col = sbase + (S8 && (x & 1) ? cfg::copy1 + 8 : 0) + 2 * x * cfg::px + (lane >> 4) * 16;
    lo = col + base * cfg::prow;
    hi = col - base * cfg::prow;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int t = 0; t < 32; t++)
            acc[mi][t] = 0;
}

// The MMAs of MT stem rows, row0.. of the item's 5 (its patch at ring
// base `base`), at this warp's 16 columns (warp w: stem columns 16 w ..):
// m16 tile mi is stem row row0 + mi. Accumulator acc[mi][4 ni + e]:
// column 16 w + 2 (lane / 4) + ((e >= 2) xor stem_flip), channel 8 ni +
// 2 (lane % 4) + e % 2.
template <bool S8, int MT>
__device__ __forceinline__ void stem_mma(int row0, int base, uint32_t sbase, uint32_t brow, int warp, int lane,
                                         typename acc_type<S8>::type (&acc)[MT][32])
{
    typedef stem_cfg<S8, false> cfg;
    constexpr int PX = cfg::px, KSTEPS = PX / 4;  // 32-byte k steps per filter row
    uint32_t lo, hi;
    stem_a_rows<S8, MT>(base, sbase, warp, lane, lo, hi, acc);
    // Each tile's row address (stem_row_addr's), stepped a filter row at a
    // time, as the loop is not unrolled: + prow, and from base lo to base
    // hi where the patch row reaches 8.
    uint32_t at[MT];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
        at[mi] = stem_row_addr<S8>(lo, hi, 2 * (row0 + mi));
    const uint32_t wrap = lo - hi;
#pragma unroll 1
    for (int r = 0; r < 7; r++) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            const uint32_t kw = (r * KSTEPS + kk) * 32;
            uint32_t a[MT][4], b[8][2];
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(a[mi][0]), "=r"(a[mi][1]), "=r"(a[mi][2]), "=r"(a[mi][3])
                             : "r"(at[mi] + kk * 32));
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
                    mma_16816(acc[mi] + 4 * ni, a[mi], b[ni]);
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
            at[mi] += cfg::prow - (2 * (row0 + mi) + r + 1 == 8 ? wrap : 0);
    }
}

// stem_mma on the tensor cores' warpgroup path (sm_90a): the same A
// fragments (ldmatrix from the patch, per warp, which wgmma takes from
// registers), B the k step's tile of weights read by wgmma from shared
// memory (wbase: stem_cfg::w_bytes), m64n64 per stem row, the warpgroup's
// 4 warps its 64 columns. The last warp's columns are past the row: it
// repeats the warp before's (no branch: a divergent one would serialise
// the MMAs), and stem_pool_out drops them. In a pass of two rows, the
// second row's filter rows 0-4 are the first's 2-6 (the same patch rows):
// each such fragment is loaded once, for the second row, and kept for the
// first's k step 2 filter rows later, 9 ldmatrix a k step's column where
// there were 14. The fragments live in a ring of W register sets, W = the
// reuse distance + 2, so that the set a step overwrites was last read by
// MMAs at least two steps back, which wgmma_wait<1> has seen done.
template <bool S8, int MT>
__device__ __forceinline__ void stem_mma_wg(int row0, int base, uint32_t sbase, uint32_t wbase, int warp, int lane,
                                            typename acc_type<S8>::type (&acc)[MT][32])
{
    typedef stem_cfg<S8, true> cfg;
    typedef typename acc_type<S8>::type acc_t;
    constexpr int PX = cfg::px, KSTEPS = PX / 4;
    // Fragment key q * KSTEPS + kk: patch row 2 row0 + q, k step kk of it;
    // tile mi at step j reads key j + 2 mi KSTEPS.
    constexpr int D = 2 * (MT - 1) * KSTEPS, W = D + 2;
    static_assert(MT <= 2, "fragments shared by two rows at most");
    uint32_t lo, hi;
    stem_a_rows<S8, MT>(base, sbase, min(warp, STEM_SW / 16 - 1), lane, lo, hi, acc);
    uint32_t a[W][4];
#pragma unroll
    for (int j = 0; j < cfg::ksteps; j++) {
        if (j >= 2)
            wgmma_wait<1>();
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            const int key = j + 2 * mi * KSTEPS;
            if (mi < MT - 1 && j >= D)
                continue;  // loaded D steps back, for tile MT - 1
            uint32_t(&f)[4] = a[key % W];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                         : "r"(stem_row_addr<S8>(lo, hi, 2 * row0 + key / KSTEPS) + key % KSTEPS * 32));
        }
        wgmma_fence();
        const uint64_t db = wgmma_desc_plain(wbase + j * 2048, 1024, 128);
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
            wgmma_rs<64, acc_t>::mma(acc[mi], a[(j + 2 * mi * KSTEPS) % W], db);
        wgmma_commit();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
        wgmma_pin(acc[mi]);
}

// threadIdx.x, read afresh: in the wgmma kernels the item loop's address
// arithmetic is recomputed per item from it rather than hoisted out of
// the loop, where its ~30 values took registers from the accumulators
// (the mma.sync kernels keep the hoisting, which fits them).
__device__ __forceinline__ int tid_fresh(void)
{
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}

__device__ __forceinline__ int acc_max(int a, int b)
{
    return max(a, b);
}
__device__ __forceinline__ float acc_max(float a, float b)
{
    return fmaxf(a, b);
}

// One pooled row from v, the column-wise max of its (up to) 3 stem rows
// at this warp's 16 columns (v[4 ni + e] as acc[mi] in stem_mma). The max
// pool is taken on the sums, before the epilogue: the epilogue (FP16:
// + bias, ReLU, rounding to half; INT8: int8.h's requantisation with a
// multiplier >= 0) is non-decreasing in the sum, so the max of the
// epilogues is the epilogue of the max, bit for bit, and only a quarter of
// the values go through it. Pooled column 8 w + i (i = lane / 4) takes
// stem columns 16 w + 2 i - 1 .. + 1: the thread's own two and one
// shuffled from lane - 4, or for i = 0 the previous warp's last column
// (through xch; none at warp 0). Every lane finishes its own pooled
// values. Output through stage ([pw][srow]), then 16-byte stores.
template <bool S8, bool WG>
__device__ __forceinline__ void stem_pool_out(typename acc_type<S8>::type (&v)[32], const float *fac, const conv_q8 &q,
                                              typename acc_type<S8>::type *xch, unsigned char *stage,
                                              unsigned char *out, int warp, int lane, int tid)
{
    typedef stem_cfg<S8, WG> cfg;
    typedef typename acc_type<S8>::type acc_t;
    const int i = lane >> 2, c0 = 2 * (lane & 3);
    // Columns 2 i and 2 i + 1 of channel 8 ni + c0 + b (selects: an index
    // into v known only at run time would put v in local memory).
    const bool flip = stem_flip<S8>(i);
    auto even = [&](int ni, int b) { return flip ? v[4 * ni + 2 + b] : v[4 * ni + b]; };
    auto odd = [&](int ni, int b) { return flip ? v[4 * ni + b] : v[4 * ni + 2 + b]; };
    if (i == 7)  // column 15: the next warp's column -1
#pragma unroll
        for (int ni = 0; ni < 8; ni++) {
            xch[warp * STEM_K + 8 * ni + c0] = odd(ni, 0);
            xch[warp * STEM_K + 8 * ni + c0 + 1] = odd(ni, 1);
        }
    __syncthreads();
    const int down = (lane - 4) & 31;
    // Every lane reads the previous warp's column (a broadcast; warp 0 reads
    // its own, unused): selects, where branches cost more than the loads.
    const acc_t *const lx = xch + (warp > 0 ? warp - 1 : 0) * STEM_K + c0;
    const int o = (8 * warp + i) * cfg::srow;
#pragma unroll
    for (int ni = 0; ni < 8; ni++) {
        acc_t p[2];
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const acc_t e = even(ni, b), o1 = odd(ni, b);
            // Column 2 i - 1: lane - 4's odd column (the same channels at i - 1).
            const acc_t up = __shfl_sync(0xffffffffu, o1, down), l = lx[8 * ni + b];
            const acc_t prev = i > 0 ? up : warp > 0 ? l : e;  // column 2 i - 1, or none
            p[b] = acc_max(acc_max(e, o1), prev);
        }
        if (16 * warp >= STEM_SW)  // wgmma's last warp: columns past the row
            continue;
        // This thread's channels' bias and multiplier, from shared memory:
        // loads from global memory the compiler hoisted above the MMAs, in
        // 32 registers that the accumulators then lacked.
        const float2 bf = *reinterpret_cast<const float2 *>(fac + 8 * ni + c0);
        if constexpr (S8) {
            const float2 mf = *reinterpret_cast<const float2 *>(fac + STEM_K + 8 * ni + c0);
            const int v0 = int8_requant_lo(s8_value(p[0], mf.x, bf.x, 0, 0.f, false), q.out_inv, 1);
            const int v1 = int8_requant_lo(s8_value(p[1], mf.y, bf.y, 0, 0.f, false), q.out_inv, 1);
            *reinterpret_cast<uint16_t *>(stage + o + 8 * ni + c0) = (uint16_t)u8_pack2(v1, v0, 0);  // after a ReLU
        } else {
            *reinterpret_cast<__half2 *>(stage + o + 2 * (8 * ni + c0)) = __floats2half2_rn(fmaxf(p[0] + bf.x, 0.f),
                                                                                            fmaxf(p[1] + bf.y, 0.f));
        }
    }
    __syncthreads();
    // 16-byte chunks: INT8's pooled row is at most one a thread, FP16's two.
    constexpr int CH = cfg::orow / 16, T = cfg::threads, PW = STEM_SW / 2;
#pragma unroll
    for (int k = 0; k < (PW * CH + T - 1) / T; k++) {
        const int id = tid + k * T, px = id / CH;
        if (PW * CH % T != 0 && id >= PW * CH)
            break;
        reinterpret_cast<uint4 *>(out)[id] = *reinterpret_cast<const uint4 *>(stage + px * cfg::srow +
                                                                              (id - px * CH) * 16);
    }
}

template <bool S8, bool WG>
__global__ void __launch_bounds__(stem_cfg<S8, WG>::threads, 2)
    stem_pool_kernel(int n, int h, const void *__restrict__ in_, const stem_rgb src, const void *__restrict__ wgt_,
                     const float *__restrict__ bias, const conv_q8 q, void *__restrict__ out_)
{
    typedef stem_cfg<S8, WG> cfg;
    typedef typename acc_type<S8>::type acc_t;
    constexpr int PX = cfg::px;
    const unsigned char *in = static_cast<const unsigned char *>(in_);
    const unsigned char *wgt = static_cast<const unsigned char *>(wgt_);
    const int sh = h / 2, ph = sh / 2, pw = STEM_SW / 2, pairs = (ph + 1) / 2, items = n * pairs;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    extern __shared__ __align__(128) unsigned char smem[];
    acc_t *const xch = reinterpret_cast<acc_t *>(smem + cfg::x_off);  // [warps][64]
    unsigned char *const stage = smem + cfg::s_off;  // [pw][srow]
    uint32_t *const lut = reinterpret_cast<uint32_t *>(smem + cfg::lut_off);
    unsigned char *const raw = smem + cfg::raw_off;  // [2 (INT8) or 1][STEM_PROWS][w * 3]
    float *const fac = reinterpret_cast<float *>(smem + cfg::f_off);

    // An item (pooled rows py, py + 1 of image img) reads input rows
    // 4 py - 5 .. 4 py + 9, columns -4 .. w + 3, zero outside the image.
    // w is STEM_MAX_W (stem_pool_fits): the loops below step by constants.
    constexpr int W = STEM_MAX_W, T = cfg::threads, RAW = cfg::raw_row;
    // threadIdx.x for an item's address arithmetic: afresh in the wgmma
    // kernels (tid_fresh).
    auto item_tid = [&]() { return WG ? tid_fresh() : tid; };
    auto item_img = [&](int item, int *py) {
        const int img = item / pairs;
        *py = 2 * (item - img * pairs);
        return img;
    };
    // The item's raw RGB rows inside the image into dst, from patch row
    // STEM_KEEP where it keeps the item above's (none for an image read
    // from `in`); returns whether it is read from `in`.
    auto load_raw = [&](int item, bool kept, unsigned char *dst) {
        constexpr int CPR = RAW / 16;
        int py;
        const int img = item_img(item, &py), iy0 = 4 * py - 5;
        if (__ldg(src.which + img) >= 0)
            return true;
        const unsigned char *src_img = src.rgb + (size_t)img * h * RAW;
        for (int c = item_tid() + (kept ? STEM_KEEP : 0) * CPR; c < STEM_PROWS * CPR; c += T) {
            const int r = c / CPR, j = c - r * CPR, iy = iy0 + r;
            if ((unsigned)iy < (unsigned)h)
                cp_async16(dst + r * RAW + j * 16, src_img + (size_t)iy * RAW + j * 16, true);
        }
        return false;
    };
    // INT8: the item's patch from row FIRST (STEM_KEEP where it keeps the
    // item above's) into its ring slots, both copies, 4 pixels a step, from
    // its raw rows through the table, or from `in` (from_in: load_raw's
    // answer).
    auto fill_patch_s8 = [&](auto first_c, int item, const unsigned char *rows, bool from_in) {
        constexpr int FIRST = decltype(first_c)::value, NR = STEM_PROWS - FIRST;
        constexpr int G = W / 4, U = (NR * G + T - 1) / T;  // steps a thread
        int py;
        const int img = item_img(item, &py), iy0 = 4 * py - 5, tid = item_tid(), base = stem_ring_base(py);
        // Every step's loads, then the stores: the compiler cannot move a
        // shared-memory load above a store it may alias.
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int u = tid + k * T, r = FIRST + u / G, g = u - (r - FIRST) * G, iy = iy0 + r;
            v[k] = make_uint4(0, 0, 0, 0);
            if (u >= NR * G || (unsigned)iy >= (unsigned)h)
                continue;
            if (from_in) {
                v[k] = __ldg(reinterpret_cast<const uint4 *>(in + (((size_t)img * h + iy) * W + 4 * g) * PX));
            } else {
                // Bytes R0 G0 B0 R1 | G1 B1 R2 G2 | B2 R3 G3 B3, little-endian.
                const uint32_t *p = reinterpret_cast<const uint32_t *>(rows + r * RAW + 12 * g);
                const uint32_t a = p[0], b = p[1], c = p[2];
                v[k].x = lut[a & 255] | lut[256 + (a >> 8 & 255)] | lut[512 + (a >> 16 & 255)];
                v[k].y = lut[a >> 24] | lut[256 + (b & 255)] | lut[512 + (b >> 8 & 255)];
                v[k].z = lut[b >> 16 & 255] | lut[256 + (b >> 24)] | lut[512 + (c & 255)];
                v[k].w = lut[c >> 8 & 255] | lut[256 + (c >> 16 & 255)] | lut[512 + (c >> 24)];
            }
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int u = tid + k * T, r = FIRST + u / G, g = u - (r - FIRST) * G;
            if (u >= NR * G)
                break;
            unsigned char *d = smem + (r ^ base) * cfg::prow + (4 * g + 4) * PX;
            *reinterpret_cast<uint4 *>(d) = v[k];
            *reinterpret_cast<uint2 *>(d + cfg::copy1 + 8) = make_uint2(v[k].x, v[k].y);
            *reinterpret_cast<uint2 *>(d + cfg::copy1 + 16) = make_uint2(v[k].z, v[k].w);
        }
    };
    // FP16: the same, one copy, 4 pixels (32 bytes) a step, the loads and
    // stores of two steps at a time (all four at once spilled).
    auto fill_patch_f16 = [&](auto first_c, int item, const unsigned char *rows, bool from_in) {
        constexpr int FIRST = decltype(first_c)::value, NR = STEM_PROWS - FIRST;
        constexpr int G = W / 4, U = (NR * G + T - 1) / T, UB = 2;
        int py;
        const int img = item_img(item, &py), iy0 = 4 * py - 5, tid = item_tid(), base = stem_ring_base(py);
#pragma unroll 1
        for (int k0 = 0; k0 < U; k0 += UB) {
            uint4 v[UB][2];
#pragma unroll
            for (int j = 0; j < UB; j++) {
                const int u = tid + (k0 + j) * T, r = FIRST + u / G, g = u - (r - FIRST) * G, iy = iy0 + r;
                v[j][0] = v[j][1] = make_uint4(0, 0, 0, 0);
                if (k0 + j >= U || u >= NR * G || (unsigned)iy >= (unsigned)h)
                    continue;
                if (from_in) {
                    const uint4 *p = reinterpret_cast<const uint4 *>(in + (((size_t)img * h + iy) * W + 4 * g) * PX);
                    v[j][0] = __ldg(p);
                    v[j][1] = __ldg(p + 1);
                } else {
                    const uint32_t *p = reinterpret_cast<const uint32_t *>(rows + r * RAW + 12 * g);
                    const uint32_t a = p[0], b = p[1], c = p[2];
                    v[j][0] = make_uint4(lut[a & 255] | lut[256 + (a >> 8 & 255)], lut[512 + (a >> 16 & 255)],
                                         lut[a >> 24] | lut[256 + (b & 255)], lut[512 + (b >> 8 & 255)]);
                    v[j][1] = make_uint4(lut[b >> 16 & 255] | lut[256 + (b >> 24)], lut[512 + (c & 255)],
                                         lut[c >> 8 & 255] | lut[256 + (c >> 16 & 255)], lut[512 + (c >> 24)]);
                }
            }
#pragma unroll
            for (int j = 0; j < UB; j++) {
                const int u = tid + (k0 + j) * T, r = FIRST + u / G, g = u - (r - FIRST) * G;
                if (k0 + j >= U || u >= NR * G)
                    break;
                uint4 *d = reinterpret_cast<uint4 *>(smem + (r ^ base) * cfg::prow + (4 * g + 4) * PX);
                d[0] = v[j][0];
                d[1] = v[j][1];
            }
        }
    };
    bool from_in = false;  // the next item's image is read from `in`
    // The item's patch by its precision, all of it or (kept) the new rows.
    auto fill = [&](int item, bool kept, const unsigned char *rows) {
        if constexpr (S8) {
            if (kept)
                fill_patch_s8(std::integral_constant<int, STEM_KEEP>(), item, rows, from_in);
            else
                fill_patch_s8(std::integral_constant<int, 0>(), item, rows, from_in);
        } else {
            if (kept)
                fill_patch_f16(std::integral_constant<int, STEM_KEEP>(), item, rows, from_in);
            else
                fill_patch_f16(std::integral_constant<int, 0>(), item, rows, from_in);
        }
    };
    for (int k = tid; k < 2 * STEM_K; k += T)
        fac[k] = k < STEM_K ? __ldg(bias + k) : S8 ? __ldg(q.mult + k - STEM_K) : 0.f;
    if constexpr (S8) {
        for (int k = tid; k < 3 * 256; k += T)
            lut[k] = (uint32_t)(uint8_t)__ldg(static_cast<const int8_t *>(src.lut) + k) << 8 * (k >> 8);
        // The pad columns (-4 .. -1, w .. w + 3) of both copies, once: the
        // items write only the image's columns. 8-byte stores: the second
        // copy is 8 mod 16.
        for (int k = tid; k < STEM_RING * 8; k += T) {
            const int r = k >> 3, side = k >> 2 & 1, copy = k >> 1 & 1, half = k & 1;
            *reinterpret_cast<uint2 *>(smem + copy * (cfg::copy1 + 8) + r * cfg::prow + side * (W + 4) * PX +
                                       half * 8) = make_uint2(0, 0);
        }
    } else {
        for (int k = tid; k < 3 * 256; k += T)
            lut[k] = (uint32_t)__ldg(static_cast<const unsigned short *>(src.lut) + k) << (k >> 8 == 1 ? 16 : 0);
        for (int k = tid; k < STEM_RING * 4; k += T) {  // the pad columns: 32 bytes a side
            const int r = k >> 2, side = k >> 1 & 1, half = k & 1;
            *reinterpret_cast<uint4 *>(smem + r * cfg::prow + side * (W + 4) * PX + half * 16) = make_uint4(0, 0, 0, 0);
        }
    }
    for (int id = tid; id < STEM_K * 7 * 8 * PX / 16; id += T) {
        const int k = id / (7 * 8 * PX / 16), j = id - k * (7 * 8 * PX / 16);
        // wgmma: chunk j is core matrix j % 2 of k step j / 2, row k % 8 of group k / 8.
        const int at = WG ? j / 2 * 2048 + j % 2 * 1024 + k / 8 * 128 + k % 8 * 16 : k * cfg::wrow + j * 16;
        cp_async16(smem + cfg::w_off + at, wgt + ((size_t)k * 7 * 8 * PX + j * 16), true);
    }
    // Each CTA takes a run of consecutive items, so that an item after the
    // one above it (cont) keeps that item's last STEM_KEEP patch rows (in
    // the ring) and its last stem row's sums (keep), and fills and computes
    // only what is new: 8 of 15 input rows, 4 of 5 stem rows.
    const int run = (items + gridDim.x - 1) / gridDim.x, first = blockIdx.x * run;
    const int last = min(first + run, items);
    auto cont = [&](int item) { return item > first && item % pairs != 0; };
    // The table, the pads, the factors and the weights (no kernel's output) before
    // pdl_sync; the first item's rows after it, in the weights' group.
    pdl_sync();
    if (first < last)
        from_in = load_raw(first, false, raw);
    cp_async_commit();

    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    // B fragments: weight rows n (ldmatrix x4 gives two n8 tiles).
    const uint32_t brow = sbase + cfg::w_off + (((lane >> 4) * 8 + (lane & 7)) * cfg::wrow) + ((lane >> 3) & 1) * 16;
    // A stem row's sums (32 a thread), kept in shared memory for the next
    // pooled row or item: in registers, beside a two-row pass, they would
    // spill (128 a thread at most).
    acc_t *const keep = reinterpret_cast<acc_t *>(smem + cfg::k_off) + tid;
    const uint32_t wbase = sbase + cfg::w_off;
    int buf = 0;
    for (int item = first; item < last; item++) {
        int py;  // pooled rows py, py + 1
        const int img = item_img(item, &py), base = stem_ring_base(py);
        const bool kept = cont(item), next = item + 1 < last;
        unsigned char *out = static_cast<unsigned char *>(out_) + ((size_t)img * ph + py) * pw * cfg::orow;
        if constexpr (S8) {
            // This item's raw rows (the one group in flight) are in; the
            // barrier also ends the last item's MMAs, which read the patch.
            cp_async_wait<0>();
            if constexpr (WG)
                fence_proxy_async_smem();  // the weights, read by wgmma (each item: cheap, and no first-item case)
            __syncthreads();
            fill(item, kept, raw + buf * cfg::raw_bytes);
            if (next)
                from_in = load_raw(item + 1, cont(item + 1), raw + (buf ^ 1) * cfg::raw_bytes);
            cp_async_commit();
            buf ^= 1;
            __syncthreads();
        } else {
            // One raw buffer: the next item's rows load once this item's
            // patch is filled (the second barrier), under its MMAs.
            cp_async_wait<0>();
            if constexpr (WG)
                fence_proxy_async_smem();
            __syncthreads();
            fill(item, kept, raw);
            __syncthreads();
            if (next)
                from_in = load_raw(item + 1, cont(item + 1), raw);
            cp_async_commit();
        }

        // MT stem rows from row0 of the item's 5.
        auto rows = [&](auto mt_c, int row0, acc_t(&acc)[decltype(mt_c)::value][32]) {
            constexpr int MT = decltype(mt_c)::value;
            if constexpr (WG)
                stem_mma_wg<S8, MT>(row0, base, sbase, wbase, warp, lane, acc);
            else
                stem_mma<S8, MT>(row0, base, sbase, brow, warp, lane, acc);
        };
        // Stem row 0 (above the image at py = 0) into keep, unless the item
        // above left it there as its row 4. Then pooled row py from rows
        // 0-2, row 2 kept for pooled row py + 1 with rows 3 and 4, and row
        // 4 for the next item: passes of two rows, 64 accumulators (three
        // rows' 96 would not fit two CTAs an SM).
        if (!kept && py > 0) {
            acc_t acc[1][32];
            rows(std::integral_constant<int, 1>(), 0, acc);
#pragma unroll
            for (int t = 0; t < 32; t++)
                keep[t * T] = acc[0][t];
        }
        // Row 2 for pooled row py + 1: INT8's wgmma kernel holds it in
        // registers, and runs rows 3 and 4 as passes of one, folding each
        // into it (a pass of two beside it would spill); the others keep it
        // in shared memory. At 128 registers ptxas serialises INT8's wgmmas
        // again (C7512); it still measured faster (bench/gpu-notes-diary.md).
        constexpr bool R2 = WG && S8;
        acc_t r2[R2 ? 32 : 1];
        {
            acc_t acc[2][32];
            rows(std::integral_constant<int, 2>(), 1, acc);
#pragma unroll
            for (int t = 0; t < 32; t++) {
                acc_t v = acc_max(acc[0][t], acc[1][t]);
                if (py > 0)
                    v = acc_max(v, keep[t * T]);
                if constexpr (R2)
                    r2[t] = acc[1][t];
                else
                    keep[t * T] = acc[1][t];
                acc[0][t] = v;
            }
            stem_pool_out<S8, WG>(acc[0], fac, q, xch, stage, out, warp, lane, tid);
        }
        if (py + 1 < ph) {
            acc_t acc[2][32];
            if constexpr (R2) {
#pragma unroll
                for (int row = 3; row <= 4; row++) {
                    acc_t one[1][32];
                    rows(std::integral_constant<int, 1>(), row, one);
#pragma unroll
                    for (int t = 0; t < 32; t++) {
                        if (row == 4)
                            keep[t * T] = one[0][t];
                        r2[t] = acc_max(r2[t], one[0][t]);
                    }
                }
#pragma unroll
                for (int t = 0; t < 32; t++)
                    acc[0][t] = r2[t];
            } else {
                rows(std::integral_constant<int, 2>(), 3, acc);
#pragma unroll
                for (int t = 0; t < 32; t++) {
                    const acc_t v = acc_max(acc_max(acc[0][t], acc[1][t]), keep[t * T]);
                    keep[t * T] = acc[1][t];
                    acc[0][t] = v;
                }
            }
            // The barriers in stem_pool_out order the reads of xch and
            // stage above before these writes.
            stem_pool_out<S8, WG>(acc[0], fac, q, xch, stage, out + (size_t)pw * cfg::orow, warp, lane, tid);
        }
    }
    cp_async_wait<0>();
}

// The four kernels, [INT8][wgmma].
typedef void (*stem_fn)(int, int, const void *, const stem_rgb, const void *, const float *, const conv_q8, void *);
struct stem_variant {
    stem_fn fn;
    int threads, smem;
};
static const stem_variant g_stem[2][2] = {
    { { stem_pool_kernel<false, false>, stem_cfg<false, false>::threads, stem_cfg<false, false>::smem },
      { stem_pool_kernel<false, true>, stem_cfg<false, true>::threads, stem_cfg<false, true>::smem } },
    { { stem_pool_kernel<true, false>, stem_cfg<true, false>::threads, stem_cfg<true, false>::smem },
      { stem_pool_kernel<true, true>, stem_cfg<true, true>::threads, stem_cfg<true, true>::smem } },
};
// Their persistent grids: as many CTAs as fit on the device stem_pool_init
// last ran on (another count only changes how many items each CTA takes).
static std::atomic<int> g_stem_ctas[2][2] = { { { 1 }, { 1 } }, { { 1 }, { 1 } } };
// The wgmma kernels run only where every device stem_pool_init ran on has
// them (the variant is picked at launch, for any of the process's
// devices); tests may turn them off.
static std::atomic<int> g_stem_wg_ok{ 0 }, g_stem_wg_lacking{ 0 }, g_stem_wg_on{ 1 };

int stem_pool_fits(int h, int w, int c, int k)
{
    return c == 4 && k == STEM_K && h % 4 == 0 && w % 4 == 0 && h >= 8 && w == STEM_MAX_W;
}

cudaError_t stem_pool_init(int num_sms, int has_wgmma)
{
    cudaError_t e = cudaSuccess;
    for (int s8 = 0; s8 < 2; s8++)
        for (int wg = 0; wg < 2 && e == cudaSuccess; wg++) {
            const stem_variant *v = &g_stem[s8][wg];
            int per_sm = 1;
            e = cudaFuncSetAttribute(v->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v->smem);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v->fn, v->threads, v->smem);
            if (e == cudaSuccess)
                g_stem_ctas[s8][wg] = num_sms * (per_sm > 0 ? per_sm : 1);
        }
    if (e != cudaSuccess)
        return e;
    if (!has_wgmma)
        g_stem_wg_lacking = 1;
    g_stem_wg_ok = !g_stem_wg_lacking;
    return cudaSuccess;
}

void stem_pool_use_wgmma(int on)
{
    g_stem_wg_on = on;
}

int stem_pool_wgmma_usable(void)
{
    return g_stem_wg_ok;
}

cudaError_t stem_pool_launch(int kind, int n, int h, int w, const void *in, const stem_rgb *rgb, const void *wgt,
                             const float *bias, const conv_q8 *q, void *out, cudaStream_t st)
{
    const int s8 = kind == CONV_INT8;
    if (n < 1 || !stem_pool_fits(h, w, 4, STEM_K) || s8 != (q != NULL) || !rgb || kind == CONV_FP32 || !rgb->rgb ||
        !rgb->lut || !rgb->which)
        return cudaErrorInvalidValue;
    if ((((uintptr_t)in | (uintptr_t)rgb->rgb) & 15) != 0)
        return cudaErrorMisalignedAddress;  // the images are read in 16-byte chunks
    const conv_q8 none = {};
    const int wg = g_stem_wg_ok && g_stem_wg_on;
    const stem_variant *v = &g_stem[s8][wg];
    const int items = n * ((h / 4 + 1) / 2);  // two pooled rows each
    // A persistent grid, unless a test caps it.
    const int cap = conv_persistent_cap();
    const int most = cap > 0 ? cap : g_stem_ctas[s8][wg].load();
    // Runs of consecutive items (stem_pool_kernel): the fewest CTAs for
    // runs of `run` items, a count from which the kernel's own run,
    // ceil(items / ctas), comes out the same.
    const int run = (items + most - 1) / most, ctas = (items + run - 1) / run;
    return launch_k(v->fn, ctas, v->threads, v->smem, st, n, h, in, *rgb, wgt, bias, s8 ? *q : none, out);
}
