// PIL-exact Resize(256) + CenterCrop(224) on the GPU: decoded planar RGB in
// device memory -> the engine's uint8 HWC 224x224x3 input, bit for bit what
// image/preprocess.c computes on the CPU.
//
// Pillow resamples horizontally into a uint8 image, then vertically, each
// pass in 22-bit fixed point with coefficients computed in double. Here one
// thread makes one output pixel: it computes its column's coefficients, and
// for each source row its vertical taps touch it recomputes the horizontal
// pass's uint8 value for that row (the same integer sums, so the same byte
// PIL stores), then accumulates them with the row's vertical weights. That
// repeats some horizontal work (taps_y times) but needs no intermediate
// image and no second kernel; at 0.6 MP sources it is ~25 taps per pixel.
//
// The hardware decoder's RGB, whose chroma it replicated, is first turned
// back into Y, Cb, Cr planes (chroma_rebuild_kernel, gpu/chroma_rebuild.h)
// and then read as a YCbCr source.
//
// A YCbCr source is turned into the RGB pixels libjpeg-turbo would have
// produced from the same planes, where the kernel reads them: chroma by
// libjpeg's "fancy" (triangle) upsampling, h2v1 for 4:2:2, h2v2 for 4:2:0
// and h1v2 for 4:4:0, or by replication for 4:1:1 and 4:1:0 (jdsample.c),
// with its edge rules and rounding biases, then jdcolor.c's fixed-point
// YCbCr -> RGB. Images narrower or shorter than 3 pixels, and 2x-subsampled
// ones whose chroma is under 3 samples wide (libjpeg replicates there),
// never come here.
//
// The coefficient arithmetic follows Pillow's expression order with
// explicitly rounded double operations (__dadd_rn etc.), so no FMA
// contraction can change a weight's last bit and flip a rounding.
#include "gpu/chroma_rebuild.h"
#include "gpu/kernels.cuh"

#define PRECISION_BITS 22
#define CROP 224

__device__ static double bilinear_filter(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? __dsub_rn(1.0, x) : 0.0;
}

// Pillow's precompute_coeffs for output index xx of an axis in_size ->
// out_size: first source index, tap count and fixed-point weights.
__device__ static int axis_coeffs(int in_size, int out_size, int xx, int *xmin, int32_t *k)
{
    double scale = __ddiv_rn((double)in_size, (double)out_size);
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filterscale;
    double ss = __ddiv_rn(1.0, filterscale);
    double center = __dmul_rn(__dadd_rn((double)xx, 0.5), scale);
    int lo = (int)__dadd_rn(__dsub_rn(center, support), 0.5);
    int hi = (int)__dadd_rn(__dadd_rn(center, support), 0.5);
    if (lo < 0)
        lo = 0;
    if (hi > in_size)
        hi = in_size;
    int n = hi - lo;
    if (n > RESIZE_MAX_TAPS)
        n = RESIZE_MAX_TAPS;  // the host refuses such images; never reached
    double ww = 0.0;
    for (int x = 0; x < n; x++)
        ww = __dadd_rn(ww, bilinear_filter(__dmul_rn(__dadd_rn(__dsub_rn((double)(x + lo), center), 0.5), ss)));
    for (int x = 0; x < n; x++) {
        double w = bilinear_filter(__dmul_rn(__dadd_rn(__dsub_rn((double)(x + lo), center), 0.5), ss));
        if (ww != 0.0)
            w = __ddiv_rn(w, ww);
        k[x] = w < 0 ? (int32_t)__dadd_rn(-0.5, __dmul_rn(w, (double)(1 << PRECISION_BITS)))
                     : (int32_t)__dadd_rn(0.5, __dmul_rn(w, (double)(1 << PRECISION_BITS)));
    }
    *xmin = lo;
    return n > 0 ? n : 0;
}

__device__ static int clip8(int32_t v)
{
    if (v >= (int32_t)(255u << PRECISION_BITS))
        return 255;
    if (v <= 0)
        return 0;
    return v >> PRECISION_BITS;
}

__device__ static int range_limit(int v)
{
    return v < 0 ? 0 : v > 255 ? 255 : v;
}

// Source pixel (x, y) as RGB.
__device__ static void src_rgb(const resize_job &j, int x, int y, int32_t px[3])
{
    size_t o = (size_t)y * j.pitch + x;
    if (j.fmt == RESIZE_SRC_RGB) {
        px[0] = j.src[o];
        px[1] = j.src[j.plane + o];
        px[2] = j.src[2 * j.plane + o];
        return;
    }
    int luma = j.src[o];
    if (j.fmt == RESIZE_SRC_GRAY) {
        px[0] = px[1] = px[2] = luma;
        return;
    }
    // jdcolor.c: FIX(1.40200), FIX(1.77200), FIX(0.71414), FIX(0.34414) at
    // 16 fractional bits, ONE_HALF rounding, arithmetic right shifts.
    int cb = chroma_upsample_at(j.u, j.cw, j.ch, j.cpitch, j.cstep, j.hs, j.vs, x, y) - 128;
    int cr = chroma_upsample_at(j.v, j.cw, j.ch, j.cpitch, j.cstep, j.hs, j.vs, x, y) - 128;
    px[0] = range_limit(luma + ((91881 * cr + 32768) >> 16));
    px[1] = range_limit(luma + ((-22554 * cb + 32768 - 46802 * cr) >> 16));
    px[2] = range_limit(luma + ((116130 * cb + 32768) >> 16));
}

// grid (CROP output rows, jobs), block CROP threads: one output pixel each.
__global__ void resize_crop_u8_kernel(const resize_job *jobs)
{
    const resize_job j = jobs[blockIdx.y];
    const int yy = blockIdx.x, xx = threadIdx.x;
    __shared__ int32_t ky[RESIZE_MAX_TAPS];
    __shared__ int ymin_s, ny_s;
    if (xx == 0)
        ny_s = axis_coeffs(j.h, j.rh, j.top + yy, &ymin_s, ky);
    int32_t kx[RESIZE_MAX_TAPS];
    int xmin;
    int nx = axis_coeffs(j.w, j.rw, j.left + xx, &xmin, kx);
    __syncthreads();

    int32_t acc[3] = { 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1) };
    for (int y = 0; y < ny_s; y++) {
        int32_t sum[3] = { 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1) };
        for (int x = 0; x < nx; x++) {
            int32_t px[3];
            src_rgb(j, xmin + x, ymin_s + y, px);
            for (int c = 0; c < 3; c++)
                sum[c] += px[c] * kx[x];
        }
        for (int c = 0; c < 3; c++)
            acc[c] += clip8(sum[c]) * ky[y];
    }
    uint8_t *out = j.dst + ((size_t)yy * CROP + xx) * 3;
    out[0] = (uint8_t)clip8(acc[0]);
    out[1] = (uint8_t)clip8(acc[1]);
    out[2] = (uint8_t)clip8(acc[2]);
}

// grid (any, jobs), one thread per chroma block and pass: the block's
// hs x vs replicated RGB pixels -> their Y in plane 0, Cb and Cr at the
// block's first pixel in planes 1 and 2. Each thread reads and writes only
// its own block's bytes, so the planes are rebuilt in place.
__global__ void chroma_rebuild_kernel(const resize_job *jobs)
{
    const resize_job j = jobs[blockIdx.y];
    if (!j.rebuild)
        return;
    uint8_t *r = j.rebuild, *g = r + j.plane, *b = g + j.plane;
    for (int blk = blockIdx.x * blockDim.x + threadIdx.x; blk < j.cw * j.ch; blk += gridDim.x * blockDim.x) {
        const int bx = blk % j.cw, by = blk / j.cw;
        uint8_t px[CHROMA_REBUILD_MAX_PIXELS][3], ys[CHROMA_REBUILD_MAX_PIXELS], cb, cr;
        size_t at[CHROMA_REBUILD_MAX_PIXELS];
        int n = 0;
        for (int dy = 0; dy < j.vs; dy++)
            for (int dx = 0; dx < j.hs; dx++) {
                int x = bx * j.hs + dx, y = by * j.vs + dy;
                if (x >= j.w || y >= j.h)
                    continue;
                at[n] = (size_t)y * j.pitch + x;
                px[n][0] = r[at[n]];
                px[n][1] = g[at[n]];
                px[n][2] = b[at[n]];
                n++;
            }
        chroma_rebuild_block(px, n, &cb, &cr, ys);
        for (int i = 0; i < n; i++)
            r[at[i]] = ys[i];
        g[at[0]] = cb;
        b[at[0]] = cr;
    }
}

void resize_job_planes(resize_job *j, int fmt, int hs, int vs, const uint8_t *y, int w, int h, const uint8_t *u,
                       const uint8_t *v, int cw, int ch, int cpitch, int cstep)
{
    j->fmt = fmt;
    j->hs = hs;
    j->vs = vs;
    j->src = y;
    j->u = u;
    j->v = v;
    j->plane = (long)w * h;
    j->w = w;
    j->h = h;
    j->pitch = w;
    j->cw = cw;
    j->ch = ch;
    j->cpitch = cpitch;
    j->cstep = cstep;
    j->rebuild = NULL;
}

void resize_job_rebuilt(resize_job *j, uint8_t *base, int w, int h, int hs, int vs)
{
    long plane = (long)w * h;
    int cw = (w + hs - 1) / hs, ch = (h + vs - 1) / vs;
    // libjpeg interpolates 2x-subsampled chroma only (it replicates 4:1:1
    // and 4:1:0 as the hardware does)
    int interpolated = (hs == 2 && (vs == 1 || vs == 2)) || (hs == 1 && vs == 2);
    if (!interpolated || w < 3 || h < 3 || (hs == 2 && cw <= 2)) {
        resize_job_planes(j, RESIZE_SRC_RGB, 1, 1, base, w, h, base + plane, base + 2 * plane, w, h, w, 1);
        return;
    }
    resize_job_planes(j, RESIZE_SRC_YCC, hs, vs, base, w, h, base + plane, base + 2 * plane, cw, ch, w * vs, hs);
    j->rebuild = base;
}

#define REBUILD_THREADS 256
#define REBUILD_CTAS_PER_IMAGE 64  // ~0.6 MP: ~9 blocks per thread

cudaError_t chroma_rebuild_launch(const resize_job *d_jobs, int njobs, cudaStream_t st)
{
    if (njobs <= 0)
        return cudaSuccess;
    chroma_rebuild_kernel<<<dim3(REBUILD_CTAS_PER_IMAGE, njobs), REBUILD_THREADS, 0, st>>>(d_jobs);
    return cudaGetLastError();
}

cudaError_t resize_crop_launch(const resize_job *d_jobs, int njobs, cudaStream_t st)
{
    if (njobs <= 0)
        return cudaSuccess;
    resize_crop_u8_kernel<<<dim3(CROP, njobs), CROP, 0, st>>>(d_jobs);
    return cudaGetLastError();
}
