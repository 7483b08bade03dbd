// The small kernels around the convolutions: input normalisation, the
// stem's max pool, the global average pool and the FC's bias.
// All are memory-bound; each thread moves 16-byte vectors where the layout
// allows. Layouts as in gpu/kernels.cuh.
#include <float.h>
#include <limits.h>
#include "gpu/kernels.cuh"

/* ---- normalise: uint8 RGB -> (x/255 - mean) / std, 4 channels -------- */

// The same expression, in the same FP32 order, as preprocess_normalize_chw.
__constant__ float kMean[3] = { 0.485f, 0.456f, 0.406f };
__constant__ float kStd[3] = { 0.229f, 0.224f, 0.225f };

// Pixel p of an NHWC4 image: three channels and a zero, as four floats or
// four halves (one 16- or 8-byte store).
__device__ static inline void store_pixel4(float *out, long p, float c0, float c1, float c2)
{
    reinterpret_cast<float4 *>(out)[p] = make_float4(c0, c1, c2, 0.f);
}

__device__ static inline void store_pixel4(__half *out, long p, float c0, float c1, float c2)
{
    __half2 lo = __floats2half2_rn(c0, c1);
    __half2 hi = __floats2half2_rn(c2, 0.f);
    uint2 v;
    v.x = *reinterpret_cast<uint32_t *>(&lo);
    v.y = *reinterpret_cast<uint32_t *>(&hi);
    reinterpret_cast<uint2 *>(out)[p] = v;
}

__device__ static inline float normalize_channel(uint32_t v, int c)
{
    return ((float)v / 255.0f - kMean[c]) / kStd[c];
}

// A block takes 1024 pixels: their 3072 bytes come in as 768 coalesced
// 4-byte loads into shared memory, then each thread normalises pixels t,
// t + 256, ... so each store instruction writes one contiguous run. One
// pixel per thread from three byte loads reached ~45% of the bandwidth
// this needs; four consecutive pixels per thread, with strided stores,
// was slower still.
#define NORM_PIX 1024
template <typename T>
__global__ void __launch_bounds__(256) normalize_kernel(const uint8_t *__restrict__ in, T *__restrict__ out, long npix)
{
    pdl_sync();
    __shared__ uint32_t words[NORM_PIX * 3 / 4];
    const long base = (long)blockIdx.x * NORM_PIX;
    const long n = npix - base < NORM_PIX ? npix - base : NORM_PIX;
    const uint8_t *bytes = reinterpret_cast<const uint8_t *>(words);
    if (n == NORM_PIX) {  // in + 3 * base is 4-byte aligned: base is a multiple of 1024
        const uint32_t *src = reinterpret_cast<const uint32_t *>(in + base * 3);
        for (int k = threadIdx.x; k < NORM_PIX * 3 / 4; k += blockDim.x)
            words[k] = src[k];
    } else {
        uint8_t *dst = reinterpret_cast<uint8_t *>(words);
        for (long k = threadIdx.x; k < n * 3; k += blockDim.x)
            dst[k] = in[base * 3 + k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        store_pixel4(out, base + i, normalize_channel(bytes[i * 3], 0), normalize_channel(bytes[i * 3 + 1], 1),
                     normalize_channel(bytes[i * 3 + 2], 2));
}

cudaError_t normalize_launch(int fp16, const uint8_t *in, void *out, long npix, cudaStream_t st)
{
    unsigned blocks = (unsigned)((npix + NORM_PIX - 1) / NORM_PIX);
    if (fp16)
        return launch_k(normalize_kernel<__half>, blocks, 256, 0, st, in, (__half *)out, npix);
    return launch_k(normalize_kernel<float>, blocks, 256, 0, st, in, (float *)out, npix);
}

// The FP32 input images, CHW, into the normalised tensor's [hw][4] layout
// (store_pixel4 for FP16 and FP32; INT8: quantised with inv). Work: an
// image's hw in PLACE_PARTS parts, skipped at once for an image that did
// not come as FP32 (nearly always). One thread a pixel of every image read
// the map: 0.035 ms at batch 256 on an H100, op by op; a block a part,
// 4096 blocks that return at once, 0.015. So a grid of PLACE_GRID blocks
// steps through the parts, each block first reading the map for all of
// its parts at once (one load a thread, not one round trip a part).
#define PLACE_PARTS 16
#define PLACE_GRID 256
template <typename T>
__device__ static inline void place_pixel(T *out, long p, const float *x, long hw, float inv)
{
    (void)inv;
    store_pixel4(out, p, x[0], x[hw], x[2 * hw]);
}

// One quantised value as the low byte of a word.
__device__ static inline uint32_t quantize_byte(float x, float inv)
{
    return (uint32_t)int8_quantize_dev(x, inv) & 0xffu;
}

__device__ static inline void place_pixel(int8_t *out, long p, const float *x, long hw, float inv)
{
    reinterpret_cast<uint32_t *>(out)[p] = quantize_byte(x[0], inv) | quantize_byte(x[hw], inv) << 8 |
                                           quantize_byte(x[2 * hw], inv) << 16;
}

template <typename T>
__global__ void __launch_bounds__(256) place_f32_kernel(const float *__restrict__ in, const int *__restrict__ which,
                                                        float inv, T *__restrict__ out, int n, int hw)
{
    pdl_sync();
    int mine = 0;
    for (int part = blockIdx.x + threadIdx.x * gridDim.x; part < n * PLACE_PARTS; part += blockDim.x * gridDim.x)
        mine |= which[part / PLACE_PARTS] >= 0;
    if (!__syncthreads_or(mine))
        return;
    for (int part = blockIdx.x; part < n * PLACE_PARTS; part += gridDim.x) {
        const int img = part / PLACE_PARTS, src = which[img];
        if (src < 0)
            continue;
        for (int p = (part % PLACE_PARTS) * blockDim.x + threadIdx.x; p < hw; p += PLACE_PARTS * blockDim.x)
            place_pixel(out, (long)img * hw + p, in + (long)src * 3 * hw + p, hw, inv);
    }
}

template <typename T>
static cudaError_t place_launch(const float *in, const int *which, float inv, T *out, int n, int hw, cudaStream_t st)
{
    if (n <= 0 || n > (INT_MAX - PLACE_GRID * 256) / PLACE_PARTS)  // part, stepped, stays an int
        return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
    const int parts = n * PLACE_PARTS;
    return launch_k(place_f32_kernel<T>, parts < PLACE_GRID ? parts : PLACE_GRID, 256, 0, st, in, which, inv, out, n,
                    hw);
}

cudaError_t place_f32_launch(int fp16, const float *in, const int *which, void *out, int n, int hw, cudaStream_t st)
{
    return fp16 ? place_launch(in, which, 0.f, (__half *)out, n, hw, st)
                : place_launch(in, which, 0.f, (float *)out, n, hw, st);
}

/* ---- INT8 input: quantised normalisation, 4 bytes a pixel ------------- */

// The stem's INT8 layout: 4 bytes a pixel (RGB and a zero). The
// normalised and quantised value of each byte of each channel comes from a
// table the engine computed on the host exactly as the CPU INT8 engine
// does (engine/int8.h).
__global__ void __launch_bounds__(256)
    normalize_s8_kernel(const uint8_t *__restrict__ in, const int8_t *__restrict__ lut, int8_t *__restrict__ out,
                        long npix)
{
    __shared__ uint32_t words[NORM_PIX * 3 / 4];
    __shared__ int8_t q[3][256];
    const long base = (long)blockIdx.x * NORM_PIX;
    const long n = npix - base < NORM_PIX ? npix - base : NORM_PIX;
    const uint8_t *bytes = reinterpret_cast<const uint8_t *>(words);
    for (int k = threadIdx.x; k < 3 * 256; k += blockDim.x)
        q[k / 256][k % 256] = lut[k];
    pdl_sync();  // the table is no kernel's output
    if (n == NORM_PIX) {
        const uint32_t *src = reinterpret_cast<const uint32_t *>(in + base * 3);
        for (int k = threadIdx.x; k < NORM_PIX * 3 / 4; k += blockDim.x)
            words[k] = src[k];
    } else {
        uint8_t *dst = reinterpret_cast<uint8_t *>(words);
        for (long k = threadIdx.x; k < n * 3; k += blockDim.x)
            dst[k] = in[base * 3 + k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        reinterpret_cast<uint32_t *>(out)[base + i] = (uint32_t)(uint8_t)q[0][bytes[i * 3]] |
                                                      (uint32_t)(uint8_t)q[1][bytes[i * 3 + 1]] << 8 |
                                                      (uint32_t)(uint8_t)q[2][bytes[i * 3 + 2]] << 16;
    }
}

cudaError_t normalize_s8_launch(const uint8_t *in, const int8_t *lut, int8_t *out, long npix, cudaStream_t st)
{
    unsigned blocks = (unsigned)((npix + NORM_PIX - 1) / NORM_PIX);
    return launch_k(normalize_s8_kernel, blocks, 256, 0, st, in, lut, out, npix);
}

cudaError_t place_f32_s8_launch(const float *in, const int *which, float inv, int8_t *out, int n, int hw,
                                cudaStream_t st)
{
    return place_launch(in, which, inv, out, n, hw, st);
}

/* ---- a precision mix's boundary ---------------------------------------- */

// Eight values a thread: one 16-byte load, one 8-byte store.
__global__ void quantize_f16_s8_kernel(const uint4 *in, float inv, uint2 *out, long n8)
{
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    pdl_sync();
    if (i >= n8)
        return;
    const uint4 v = in[i];
    const __half2 *h = reinterpret_cast<const __half2 *>(&v);
    int q[8];
    for (int j = 0; j < 4; j++) {
        const float2 f = __half22float2(h[j]);
        q[2 * j] = u8_quantize_dev(f.x, inv);
        q[2 * j + 1] = u8_quantize_dev(f.y, inv);
    }
    // u8_pack2(a, b, c): b in bits 7:0, a in 15:8, c's low half above.
    out[i] = make_uint2(u8_pack2(q[1], q[0], u8_pack2(q[3], q[2], 0)), u8_pack2(q[5], q[4], u8_pack2(q[7], q[6], 0)));
}

cudaError_t quantize_f16_s8_launch(const __half *in, float inv, int8_t *out, long count, cudaStream_t st)
{
    const long n8 = count / 8;
    return launch_k(quantize_f16_s8_kernel, (unsigned)((n8 + 255) / 256), 256, 0, st,
                    reinterpret_cast<const uint4 *>(in), inv, reinterpret_cast<uint2 *>(out), n8);
}

/* ---- 3x3/2 max pool, pad 1 ------------------------------------------- */

// A vector of V channels: 8 halves, 4 floats or 16 int8, 16 bytes.
template <typename T>
struct vec16;
template <>
struct vec16<__half> {
    static constexpr int V = 8;
    __half2 h[4];
    __device__ static vec16 lowest()
    {
        vec16 r;
        for (int i = 0; i < 4; i++)
            r.h[i] = __float2half2_rn(-65504.f);
        return r;
    }
    __device__ void max_with(const vec16 &o)
    {
        for (int i = 0; i < 4; i++)
            h[i] = __hmax2(h[i], o.h[i]);
    }
};
template <>
struct vec16<float> {
    static constexpr int V = 4;
    float f[4];
    __device__ static vec16 lowest()
    {
        vec16 r;
        for (int i = 0; i < 4; i++)
            r.f[i] = -FLT_MAX;
        return r;
    }
    __device__ void max_with(const vec16 &o)
    {
        for (int i = 0; i < 4; i++)
            f[i] = fmaxf(f[i], o.f[i]);
    }
};

// INT8's pool reads the stem's output, u8 (it follows a ReLU).
template <>
struct vec16<uint8_t> {
    static constexpr int V = 16;
    unsigned w[4];
    __device__ static vec16 lowest()
    {
        vec16 r;
        for (int i = 0; i < 4; i++)
            r.w[i] = 0u;
        return r;
    }
    __device__ void max_with(const vec16 &o)
    {
        for (int i = 0; i < 4; i++)
            w[i] = __vmaxu4(w[i], o.w[i]);
    }
};

template <typename T>
__global__ void __launch_bounds__(256)
    maxpool3x3s2_kernel(const T *__restrict__ in, T *__restrict__ out, int n, int h, int w, int c, int oh, int ow)
{
    pdl_sync();
    typedef vec16<T> vt;
    const int cv = c / vt::V;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long total = (long)n * oh * ow * cv;
    if (i >= total)
        return;
    int cc = (int)(i % cv);
    long p = i / cv;
    int ox = (int)(p % ow);
    int oy = (int)(p / ow % oh);
    int img = (int)(p / ((long)ow * oh));
    const vt *src = reinterpret_cast<const vt *>(in) + (long)img * h * w * cv + cc;
    vt m = vt::lowest();  // every window holds at least one pixel
    for (int dy = 0; dy < 3; dy++) {
        int y = oy * 2 - 1 + dy;
        if ((unsigned)y >= (unsigned)h)
            continue;
        for (int dx = 0; dx < 3; dx++) {
            int x = ox * 2 - 1 + dx;
            if ((unsigned)x >= (unsigned)w)
                continue;
            m.max_with(src[((long)y * w + x) * cv]);
        }
    }
    reinterpret_cast<vt *>(out)[i] = m;
}

cudaError_t maxpool_launch(int fp16, const void *in, void *out, int n, int h, int w, int c, int oh, int ow,
                           cudaStream_t st)
{
    long total = (long)n * oh * ow * (c / (fp16 ? 8 : 4));
    unsigned blocks = (unsigned)((total + 255) / 256);
    if (fp16)
        return launch_k(maxpool3x3s2_kernel<__half>, blocks, 256, 0, st, (const __half *)in, (__half *)out, n, h, w, c,
                        oh, ow);
    return launch_k(maxpool3x3s2_kernel<float>, blocks, 256, 0, st, (const float *)in, (float *)out, n, h, w, c, oh,
                    ow);
}

// On int8 values: the same as pooling in float and quantising after, q
// being monotone (engine/int8.h).
cudaError_t maxpool_s8_launch(const int8_t *in, int8_t *out, int n, int h, int w, int c, int oh, int ow,
                              cudaStream_t st)
{
    long total = (long)n * oh * ow * (c / 16);
    unsigned blocks = (unsigned)((total + 255) / 256);
    return launch_k(maxpool3x3s2_kernel<uint8_t>, blocks, 256, 0, st, reinterpret_cast<const uint8_t *>(in),
                    reinterpret_cast<uint8_t *>(out), n, h, w, c, oh, ow);
}

/* ---- global average pool --------------------------------------------- */

// Consecutive threads read consecutive channel pairs: a warp's load of a
// pixel's 32 pairs is one coalesced row.
template <typename T>
__device__ __forceinline__ float2 load2(const T *p);
template <>
__device__ __forceinline__ float2 load2<__half>(const __half *p)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(p));
}
template <>
__device__ __forceinline__ float2 load2<float>(const float *p)
{
    return *reinterpret_cast<const float2 *>(p);
}
__device__ __forceinline__ void store2(__half *p, float a, float b)
{
    *reinterpret_cast<__half2 *>(p) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store2(float *p, float a, float b)
{
    *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}

// Sums in S: float, or double for INT8 (engine/int8.h: float64 sums, the
// mean rounded to float, then to FP16 by store2). A block takes one image's
// AVG_PAIRS channel pairs; its AVG_PARTS warps sum every AVG_PARTS-th pixel
// and the first adds their partial sums in order, so the result does not
// depend on scheduling. A thread a pair over all 49 pixels left 64k
// threads each waiting on a chain of 49 loads and adds.
#define AVG_PAIRS 32
#define AVG_PARTS 8
template <typename TI, typename TO, typename S>
__global__ void __launch_bounds__(AVG_PAIRS *AVG_PARTS)
    avgpool_kernel(const TI *__restrict__ in, TO *__restrict__ out, int hw, int c)
{
    pdl_sync();
    __shared__ S part[2][AVG_PARTS][AVG_PAIRS];  // [x or y]: a warp's stores and reads are consecutive
    const int img = blockIdx.y, t = threadIdx.x % AVG_PAIRS, k = threadIdx.x / AVG_PAIRS;
    const int ch = 2 * (blockIdx.x * AVG_PAIRS + t);
    S sx = 0, sy = 0;
    if (ch < c) {
        const TI *p = in + (long)img * hw * c + ch;
        for (int j = k; j < hw; j += AVG_PARTS) {
            const float2 v = load2(p + (long)j * c);
            sx += v.x;
            sy += v.y;
        }
    }
    part[0][k][t] = sx;
    part[1][k][t] = sy;
    __syncthreads();
    if (k == 0 && ch < c) {
        for (int i = 1; i < AVG_PARTS; i++) {
            sx += part[0][i][t];
            sy += part[1][i][t];
        }
        store2(out + (long)img * c + ch, (float)(sx / hw), (float)(sy / hw));
    }
}

cudaError_t avgpool_launch(int kind, const void *in, void *out, int n, int hw, int c, cudaStream_t st)
{
    if (n > 65535 || c % 2 != 0)  // the grid's y; channel pairs
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)((c / 2 + AVG_PAIRS - 1) / AVG_PAIRS), (unsigned)n), block(AVG_PAIRS * AVG_PARTS);
    if (kind == CONV_FP16)
        return launch_k(avgpool_kernel<__half, __half, float>, grid, block, 0, st, (const __half *)in, (__half *)out,
                        hw, c);
    if (kind == CONV_INT8)
        return launch_k(avgpool_kernel<float, __half, double>, grid, block, 0, st, (const float *)in, (__half *)out, hw,
                        c);
    return launch_k(avgpool_kernel<float, float, float>, grid, block, 0, st, (const float *)in, (float *)out, hw, c);
}

/* ---- head: the FC's bias --------------------------------------------- */

// cuBLAS writes W x feat; the bias is added here, in place. Softmax and
// top-k run on the host (engine/topk.c), once, for every engine alike.
__global__ void fc_bias_kernel(float *__restrict__ logits, const float *__restrict__ bias, int classes, long total)
{
    pdl_sync();
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        logits[i] += bias[i % classes];
}

cudaError_t fc_bias_launch(float *logits, const float *bias, int n, int classes, cudaStream_t st)
{
    if (n < 1 || classes < 1)
        return cudaErrorInvalidValue;
    const long total = (long)n * classes;
    return launch_k(fc_bias_kernel, (unsigned)((total + 255) / 256), 256, 0, st, logits, bias, classes, total);
}
