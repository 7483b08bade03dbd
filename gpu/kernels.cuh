// The kernels of the CUDA engine and their host launchers (CUDA C++ only;
// host C code reaches them through gpu/gpu.h and gpu/gpu_test.h).
//
// Layouts: activations NHWC, FP16 (__half), FP32 or INT8; conv weights
// KRSC ([cout][kh][kw][cin]) in the same precision; biases FP32. Every
// launcher takes the stream to run in and returns the launch's error.
// INT8 follows engine/int8.h bit for bit (the last conv's output is FP32).
#ifndef RESNETD_GPU_KERNELS_CUH
#define RESNETD_GPU_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <utility>

// Programmatic dependent launch (compute capability 9.0). A kernel launched
// by launch_k may start while the kernel before it in the stream still
// runs, so that its launch and its prologue (address arithmetic, weights,
// tables, shared-memory set-up) overlap that kernel's tail instead of
// following it. So every kernel launched by launch_k calls pdl_sync()
// before it reads what an earlier kernel wrote and before it writes global
// memory: it waits there until the kernel before it has finished and its
// writes are visible, then lets the next kernel start. The wait covers the
// kernel before only: work further back is done because that kernel, too,
// waited in every CTA before it could finish, so no CTA may return before
// its pdl_sync. Without the launch attribute both are no-ops.
__device__ __forceinline__ void pdl_sync(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 1 when every device conv_init ran on (compute capability 9.0 or later)
// takes programmatic launches.
int conv_pdl_supported(void);
// This thread's launches: without (0) programmatic launch, or with it where
// supported (1, or -1, the default); returns the previous setting. The
// engine sets it while it captures a graph (engine_tuning.pdl).
int conv_set_pdl(int on);
int conv_pdl_on(void);

// fn<<<grid, block, smem, st>>>(args...), with the programmatic launch
// attribute when conv_pdl_on(); returns the launch's error.
template <typename... P, typename... A>
cudaError_t launch_k(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = conv_pdl_on() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, fn, std::forward<A>(args)...);
}

// One convolution: input n x h x w x c, weights k x kh x kw x c, output
// n x oh x ow x k. As an implicit GEMM: M = n*oh*ow output pixels, N = k
// output channels, K = kh*kw*c. Requirements (checked by conv_shape_check):
// c a multiple of a 16-byte chunk's elements (4 FP32, 8 FP16, 16 INT8),
// or the stem's layout: c == 4 (FP16, INT8) with kw, w, pad_w and stride
// even (and kw % 4 == 0 for INT8), so that a chunk is whole pixels, two
// FP16 ones or two pairs of INT8 ones, each pair inside or outside the
// image; k % 8 == 0.
// The conv kernels' element types: FP32, FP16, INT8 (int32 sums).
enum { CONV_FP32 = 0, CONV_FP16 = 1, CONV_INT8 = 2 };

// A shortcut (FP16 and INT8, the general tiles, and INT8's 128-channel
// patch kernel with c2 = 64; stride 1): a second input
// in2 of n x h2 x w2 x c2 (c2 <= c, c2 a multiple of a chunk's elements)
// whose 1x1 conv of stride stride2 (no padding) runs in the same kernel;
// its weights follow the taps in each weight row. So a residual block's
// downsample runs inside the conv it feeds. FP16: c2 more K columns after
// the taps, out = relu?(conv(in) + conv1x1(in2) + bias). INT8 (no split-K):
// the shortcut's k tiles first, its sums requantised by its own epilogue
// (conv_q8.sc_*) into a residual tile in shared memory, which the conv's
// epilogue adds as engine/int8.h's residual. c2 = 0: none. conv_launch sets
// in2.
struct conv_shape {
    int n, h, w, c;
    int k, kh, kw;
    int stride, pad_h, pad_w;
    int oh, ow;
    int c2, h2, w2, stride2;
    const void *in2;
};

// INT8's largest shortcut (input channels). Its int32 sums reach 256 *
// 255 * 127 in magnitude on u8 inputs; sc_int2float is exact below 2^22,
// which 64 and 128 channels cannot pass (4.15M at most) but 256 (layer4.0's
// downsample) can, with inputs near 255 against weights all of one sign:
// an open item (bench/gpu-notes-diary.md, step 16).
#define CONV_S8_SC_MAX_C2 256

// The GEMM's K: the taps' columns, then the shortcut's.
__host__ __device__ __forceinline__ int conv_k(const conv_shape &s)
{
    return s.kh * s.kw * s.c + s.c2;
}

conv_shape conv_shape_make(int n, int h, int w, int c, int k, int kh, int kw, int stride, int pad_h, int pad_w);
// 0 when the kernels support the shape, else -1 with the reason in err.
int conv_shape_check(const conv_shape *s, int kind, char *err, size_t errlen);

// The tile table: the template instantiations a layer can run with.
struct conv_tile_info {
    const char *name;  // "f16_128x128x32_w2x4_s4", ...
    int bm, bn, bk;  // CTA tile in M, N and K (K in the kind's elements)
    int threads;
    int smem;  // dynamic shared memory bytes
    int ctas_per_sm;  // filled by conv_init from the occupancy calculator
    int sm90a;  // wgmma: runs only on compute capability 9.0
    int halo;  // > 0: a special kernel for 3x3 convs of this many input channels only
        // (conv_tile_fits), no split-K; INT8: int8 outputs only
    int usable;  // filled by conv_init: the current device runs it
    int family;  // tiles of one family (the same MMA instructions, K in the same order)
        // give every output the same bits when neither splits K
};
int conv_tile_count(int kind);
const conv_tile_info *conv_tile_get(int kind, int tile);
// 1 when the tile can run the shape (every general tile can; a special one
// only its own shapes).
int conv_tile_fits(int kind, int tile, const conv_shape *s);
// Sets shared-memory limits and reads occupancy; once per process and device.
cudaError_t conv_init(void);
// Tests: at most this many CTAs for the persistent kernels (the INT8 stem
// too), so that each CTA loops over several tiles on small shapes (0: as
// many as fit).
void conv_set_persistent_cap(int ctas);
int conv_persistent_cap(void);

// How one layer runs: a tile, and a split of K over `splits` CTAs of
// kt_per_split k tiles each, whose partial sums (FP32, or int32 at INT8) a
// second kernel adds up before the epilogue (splits == 1: no split, no
// workspace).
struct conv_plan {
    int tile, splits, kt_per_split;
};
// Which plans a planner may take. NULL: all. Batch invariance
// (engine_config.deterministic) asks the float kinds for plans without
// split-K (its partial sums round differently from one running sum) and,
// once a layer's family is chosen, of that family only (family -1: any).
struct conv_filter {
    int unsplit;
    int family;
};
// Every tile the filter allows, each with the split the heuristic gives it
// (none when f->unsplit); returns the count.
int conv_plan_candidates(int kind, const conv_shape *s, int num_sms, const conv_filter *f, conv_plan *out, int max);
// The plan a cost model picks among them (used when the engine does not autotune).
conv_plan conv_plan_pick(int kind, const conv_shape *s, int num_sms, const conv_filter *f);

// Workspace a plan needs (32-bit partial sums), 0 without split-K.
size_t conv_workspace_bytes(const conv_shape *s, const conv_plan *p);
// 1 when plan p can run INT8 conv s with the average pool inside
// (conv_q8.pool_out): a general wgmma tile holding an image's oh * ow rows,
// no split-K, no shortcut, whole 64-channel groups.
int conv_pool_fits(int kind, const conv_plan *p, const conv_shape *s);
// q(x) of engine/int8.h given inv = 1 / s: rint(x * inv) (no FMA), NaN ->
// 0, clamped to +-127; the CPU engine's int8_quantize, bit for bit. One
// cvt.rni.s32 does the rounding (to nearest even, as rintf), maps NaN to 0
// and saturates, so only the integer clamp is left (3 instructions, not 7:
// the INT8 epilogues are issue bound).
__device__ __forceinline__ int int8_quantize_dev(float x, float inv)
{
    return min(max(__float2int_rn(__fmul_rn(x, inv)), -127), 127);
}

// q(ReLU(v)) from v before the ReLU (relu: apply it), without the upper
// clamp, which int8_pack2 applies: with inv > 0 (the calibration's scales
// are positive) a negative v quantises to 0 or below and NaN to 0, so the
// ReLU is the clamp's lower bound 0 instead of a select on every value.
__device__ __forceinline__ int int8_requant_lo(float v, float inv, int relu)
{
    return max(__float2int_rn(__fmul_rn(v, inv)), relu ? 0 : -127);
}

// Bytes a (bits 15:8) and b (7:0), each saturated to int8, above them c's
// low 16 bits: the epilogues' upper clamp and packing in one instruction a
// pair (cvt.pack.sat), where they took three (the epilogues are issue bound).
__device__ __forceinline__ uint32_t int8_pack2(int a, int b, uint32_t c)
{
    uint32_t d;
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The same saturated to u8 (0..255): a tensor after a ReLU (engine/int8.h).
__device__ __forceinline__ uint32_t u8_pack2(int a, int b, uint32_t c)
{
    uint32_t d;
    asm("cvt.pack.sat.u8.s32.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// An epilogue's output pair: u8 after a ReLU (relu), else int8 (a
// downsample's output). Both packed, then one selected: a branch around
// each pair keeps an unrolled epilogue's loads from overlapping.
__device__ __forceinline__ uint32_t q8_pack2(int a, int b, uint32_t c, int relu)
{
    const uint32_t u = u8_pack2(a, b, c), s = int8_pack2(a, b, c);
    return relu ? u : s;
}

// Byte k of bits as the value it stores: u8 (uns) or int8.
__device__ __forceinline__ int q8_byte(uint32_t bits, int k, int uns)
{
    const uint32_t b = (bits >> (8 * k)) & 0xffu;
    return uns ? (int)b : (int)(int8_t)b;
}

// q(x) of a u8 tensor given inv: as int8_quantize_dev, clamped to 0..255.
__device__ __forceinline__ int u8_quantize_dev(float x, float inv)
{
    return min(max(__float2int_rn(__fmul_rn(x, inv)), 0), 255);
}

// INT8's epilogue (engine/int8.h): v = acc * mult[c] + bias[c]
// (+ res * res_scale), ReLU, then q(v) with out_inv into a u8 output (after
// a ReLU) or an int8 one, or v itself into an FP32 one (out_f32: the last
// conv). Every INT8 conv kernel reads u8 inputs (each follows a ReLU; the
// stem, which reads the int8 image, is gpu/stem.cu's).
struct conv_q8 {
    const float *mult;  // [k], device: s_in * s_w[c]
    float res_scale;  // the residual's scale
    int res_u8;  // the residual (res) is u8; a shortcut's own output (c2 > 0) is int8
    float out_inv;  // 1 / the output's scale
    int out_f32;
    // With a shortcut (conv_shape.c2): the downsample's own epilogue, its
    // output (no ReLU) the residual: [k] mult and bias (device, 8-byte
    // aligned), 1 / its output's scale.
    const float *sc_mult, *sc_bias;
    float sc_inv;
    // The last conv with the average pool inside (pool_out non-NULL; the
    // general wgmma tiles, no split-K, out_f32): its FP32 values are not
    // stored but summed per image (float64, engine/int8.h), and each image's
    // mean goes to pool_out [n][k] as FP16. pool_hw: an image's output
    // pixels (<= the tile's rows, so an image spans at most two tiles). An
    // image split between two tiles meets in pool_part [n][2][k] (its first
    // part's sums, then its second's); the second CTA to arrive at
    // pool_cnt [n][k / 64] (all 0 before; left 0) adds them.
    __half *pool_out;
    double *pool_part;
    int *pool_cnt;
    int pool_hw;
};
// out = relu?(conv(in, w) + bias (+ res)). res may be NULL; workspace may be
// NULL when p->splits == 1. q: INT8's epilogue, NULL for the other kinds;
// INT8's bias and q->mult 16-byte aligned (cudaMalloc's are). in2: the
// shortcut's input when s->c2 > 0, else unused; an INT8 shortcut also
// needs res NULL (its output is the residual), p->splits == 1 and
// q->sc_mult and q->sc_bias (8-byte aligned).
cudaError_t conv_launch(int kind, const conv_plan *p, const conv_shape *s, const void *in, const void *in2,
                        const void *w, const float *bias, const void *res, int relu, void *out, float *workspace,
                        const conv_q8 *q, cudaStream_t st);

// ResNet's stem, the 7x7/2 pad-3 conv with bias and ReLU, and the 3x3/2
// pad-1 max pool after it, in one kernel (gpu/stem.cu), FP16 or INT8
// (q: the conv's INT8 epilogue, NULL for FP16; q->mult >= 0, as the
// calibration's scales make it, for the pool runs before it),
// normalising the images as decoded (rgb) except
// those given as normalised tensors, read from in [n][h][w][4] (the stem's
// padded layout, 16-byte aligned); w [k][7][8][4] (stem_weights'), out
// [n][h/4][w/4][k].
// stem_pool_fits: the shapes it runs (k = 64, w = 224, h a multiple of 4).
// stem_pool_init: once per device, before a launch (num_sms: the
// device's, which sizes the persistent grids; has_wgmma: it runs the sm_90a
// kernels, which then take the stem's MMAs).
struct stem_rgb {
    const uint8_t *rgb;  // [n][h][w][3], 16-byte aligned
    const void *lut;  // [3][256]: channel c's byte b is lut[c][b]: int8 (normalize_s8_launch's) or FP16
    const int *which;  // [n]: image i is read from in instead when which[i] >= 0
};
int stem_pool_fits(int h, int w, int c, int k);
cudaError_t stem_pool_init(int num_sms, int has_wgmma);
// Tests: 0 runs the mma.sync stems even where wgmma is usable, 1 (the
// default) wgmma where usable.
void stem_pool_use_wgmma(int on);
// 1 when the stem runs on wgmma (every device initialised has it).
int stem_pool_wgmma_usable(void);
cudaError_t stem_pool_launch(int kind, int n, int h, int w, const void *in, const stem_rgb *rgb, const void *wgt,
                             const float *bias, const conv_q8 *q, void *out, cudaStream_t st);

// uint8 RGB NHWC [npix][3] -> normalised [npix][4] (FP16 or FP32), the
// fourth channel zero: the stem reads 16-byte chunks of whole pixels.
cudaError_t normalize_launch(int fp16, const uint8_t *in, void *out, long npix, cudaStream_t st);
// INT8: uint8 RGB [npix][3] -> [npix][4] int8, channel c = lut[c][byte]
// (lut: 3 x 256 in device memory, the quantised normalisation), 3 zero.
cudaError_t normalize_s8_launch(const uint8_t *in, const int8_t *lut, int8_t *out, long npix, cudaStream_t st);
// INT8 place_f32_launch: the images are quantised with inv (1 / the input
// scale) into out's [hw][4] layout. With the fused stem, the only writer
// of out: the stem reads the other images as decoded (stem_rgb).
cudaError_t place_f32_s8_launch(const float *in, const int *which, float inv, int8_t *out, int n, int hw,
                                cudaStream_t st);
// INT8 precision mixes (engine/calib.h): the float prefix's last tensor,
// count FP16 values (count % 8 == 0, 16-byte aligned), quantised with inv
// (u8_quantize_dev: it follows a ReLU) into the INT8 part's first tensor.
cudaError_t quantize_f16_s8_launch(const __half *in, float inv, int8_t *out, long count, cudaStream_t st);
// INT8 3x3/2 pad-1 max pool of the stem's u8 output, NHWC; c % 16 == 0.
cudaError_t maxpool_s8_launch(const int8_t *in, int8_t *out, int n, int h, int w, int c, int oh, int ow,
                              cudaStream_t st);
// Images that came as normalised FP32 tensors: for each of the n images
// with which[i] >= 0, out's image i becomes in[which[i]] ([3][hw] CHW FP32)
// in out's [hw][4] layout (FP16 or FP32, fourth channel zero), replacing
// what normalize_launch wrote; with the fused stem, the only writer of
// out. Images with which[i] < 0 are left alone.
// n <= 65535.
cudaError_t place_f32_launch(int fp16, const float *in, const int *which, void *out, int n, int hw, cudaStream_t st);
// 3x3 stride-2 pad-1 max pool, NHWC; c % 8 == 0.
cudaError_t maxpool_launch(int fp16, const void *in, void *out, int n, int h, int w, int c, int oh, int ow,
                           cudaStream_t st);
// Global average pool [n][hw][c] -> [n][c]; c % 2 == 0. FP16 and FP32: the
// same precision out; INT8: FP32 in, FP16 out (engine/int8.h).
cudaError_t avgpool_launch(int kind, const void *in, void *out, int n, int hw, int c, cudaStream_t st);
// logits[n][classes] += bias[classes], in place.
cudaError_t fc_bias_launch(float *logits, const float *bias, int n, int classes, cudaStream_t st);

// One image for resize_crop_launch (gpu/resize.cu): a decoded source in
// device memory, its Resize(256) size and CenterCrop(224) corner (from
// preprocess_geometry), and where its 224x224x3 HWC uint8 crop goes.
// Sources: planar RGB (plane c at src + c * plane, rows `pitch` bytes
// apart); or the JPEG's own planes as the decoder produced them, Y at src
// (w x h) and, unless grey, Cb at u and Cr at v (cw x ch, rows `cpitch`
// apart), which the kernel upsamples and converts to RGB exactly as
// libjpeg-turbo does (JFIF YCbCr -> RGB in fixed point after jdsample.c's
// upsampling: "fancy" for 4:2:2, 4:2:0 and 4:4:0, replication for 4:1:1
// and 4:1:0). Chroma samples are `cstep` bytes apart within a row: 1 for
// packed planes, hs where chroma_rebuild_launch left them in the RGB planes
// it rebuilt.
#define RESIZE_MAX_TAPS 67  // Pillow's ksize for a scale of 32 (8192 -> 256)
enum resize_src { RESIZE_SRC_RGB, RESIZE_SRC_GRAY, RESIZE_SRC_YCC };
struct resize_job {
    const uint8_t *src, *u, *v;
    long plane;
    int fmt;  // resize_src
    int hs, vs;  // YCC: luma samples per chroma sample across (1, 2, 4) and down (1, 2)
    int w, h, pitch;
    int cw, ch, cpitch, cstep;
    int rw, rh, left, top;
    uint8_t *dst;
    uint8_t *rebuild;  // or NULL: see resize_job_rebuilt
};
// Sets j up for planar RGB at base (w x h, rows w apart) whose chroma,
// subsampled hs x vs in the JPEG, was replicated, as nvJPEG's hardware
// decoder returns it: chroma_rebuild_launch turns the planes, in place, into
// Y (plane 0) and each chroma block's Cb and Cr (at the block's first pixel
// in planes 1 and 2; gpu/chroma_rebuild.h), which resize_crop_launch then
// upsamples as libjpeg does. Where libjpeg replicates chroma too (4:4:4,
// 4:1:1, 4:1:0, 2x-subsampled chroma under 3 samples wide) and below 3x3
// the planes are left as RGB.
void resize_job_rebuilt(resize_job *j, uint8_t *base, int w, int h, int hs, int vs);
// The plane half of a job: format, chroma factors, Y (or RGB) planes
// w x h at y (rows w apart, planes w*h apart), chroma cw x ch at u and v
// (rows cpitch apart, samples cstep apart); no rebuild.
void resize_job_planes(resize_job *j, int fmt, int hs, int vs, const uint8_t *y, int w, int h, const uint8_t *u,
                       const uint8_t *v, int cw, int ch, int cpitch, int cstep);
// Rebuilds the planes of every job with `rebuild` set; the others are left.
cudaError_t chroma_rebuild_launch(const resize_job *d_jobs, int njobs, cudaStream_t st);
// PIL-exact bilinear antialiased resize + crop of njobs images; d_jobs in
// device memory. Every image's ksize (both axes) must be <= RESIZE_MAX_TAPS.
cudaError_t resize_crop_launch(const resize_job *d_jobs, int njobs, cudaStream_t st);

#endif
