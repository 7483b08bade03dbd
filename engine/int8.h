/* The integer semantics of resnetd's INT8 inference, defined once: every
 * INT8 engine (the CPU one, the CUDA one) and the torch emulation in
 * tests/reference.py compute exactly this, so their INT8 activations are
 * equal bit for bit, not merely close.
 *
 * All arithmetic below is IEEE float32 with round-to-nearest-even, one
 * rounding per operation, no fused multiply-add (the build passes
 * -ffp-contract=off: clang contracts a * b + c by default; CUDA code must
 * use __fmul_rn/__fadd_rn). rint() is
 * round half to even (rintf in the default rounding mode, torch.round).
 *
 * Weights, per output channel c of a BN-folded conv (resnet18_weights):
 *   m       = max_i |w[c][i]|
 *   s_w[c]  = m / 127            (1 when m == 0)
 *   q_w     = clamp(rint(w / s_w[c]), -127, 127)
 * Activations, per tensor t with the calibration table's scale s_t:
 *   inv_t   = 1 / s_t
 *   q(x)    = clamp(rint(x * inv_t), -127, 127)        (symmetric, no -128)
 *             for a signed tensor (int8): the input image, a downsample's output;
 *   q(x)    = clamp(rint(x * inv_t), 0, 255)
 *             for an unsigned one (u8): every tensor that follows a ReLU
 *             (calib_tensor_unsigned), twice the levels for the same range;
 *   q(NaN)  = 0   (a non-finite FP32 input tensor must not reach a float to
 *                  integer conversion, which C leaves undefined; +-inf
 *                  clamp to the ends like any large value)
 * Every conv, the stem included, runs on 8-bit integers: acc = sum q_in *
 * q_w in int32, q_in u8 for every conv but the stem (each reads a ReLU's
 * output), int8 for the stem (the image); exact: |acc| <= 255 * 127 * 4608
 * < 2^31. Its epilogue, for output channel c, with mult[c] = s_in * s_w[c]
 * computed once:
 *   v = (float)acc * mult[c]
 *   v = v + bias[c]
 *   v = v + (float)r * s_r        if the conv adds a residual r (u8 or int8, scale s_r)
 *   v = v < 0 ? 0 : v             if the conv has a ReLU
 *   out = q_out(v)                the next tensor's u8 (after a ReLU) or
 *                                 int8 value, or
 *   out = v                       for the last conv, whose FP32 output feeds
 *                                 the average pool and the FC.
 * The head: each feature is the mean of its 7x7 values summed in float64
 * (order-free in practice: every partial sum of 49 floats is exact unless
 * the largest value exceeds the smallest nonzero one by more than 2^23;
 * the CPU adds in order, the CUDA engine in 8 partial sums), rounded to
 * float32 and then to FP16 (int8_round_half); the FC multiplies these by
 * FP16-rounded weights with float32 (or wider) sums, and adds the FP32
 * bias. FP16 operands let the GPU run the FC on its tensor cores, as in
 * FP16, at a third of the FP32 FC's time.
 * The 3x3/2 max pool runs on the stem's u8 output (the same as pooling in
 * float and then quantising, since q is monotone), so the pool's output has
 * the stem output's scale. The image is quantised after normalisation with
 * the "input" scale. The only arithmetic whose order differs between
 * implementations is therefore the FC's sums, and the pool's, which give
 * the same result unless a feature's values span more than 2^23.
 *
 * Precision mixes (engine/calib.h): with a float prefix, its last tensor x
 * (FP32 on the CPU, FP16 on the GPU; it follows a ReLU) becomes the u8 q(x)
 * with that tensor's scale, and everything after it is as above. The prefix itself is float, so
 * mixes are close between engines, not equal; the fully INT8 mix is. */
#ifndef RESNETD_INT8_H
#define RESNETD_INT8_H

#include <math.h>
#include <stdint.h>

/* x rounded to the nearest binary16 value (ties to even), as a float:
 * +-inf past the largest half, subnormal halves below 2^-14. */
static inline float int8_round_half(float x)
{
    union {
        float f;
        uint32_t u;
    } v = { x };
    const uint32_t a = v.u & 0x7fffffffu, sign = v.u & 0x80000000u;
    if (a >= 0x7f800000u) /* inf, NaN */
        return x;
    if (a < 0x38800000u) /* |x| < 2^-14: a multiple of 2^-24, rounded (exact scalings) */
        return rintf(x * 16777216.0f) / 16777216.0f;
    /* Keep 10 of the 23 fraction bits: round at bit 13 to even; a carry
     * into the exponent is right, and 2^16 or more is past FP16's range. */
    uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
    v.u = sign | (r >= 0x47800000u ? 0x7f800000u : r);
    return v.f;
}

/* rint(x * inv) clamped to [lo, hi], NaN to 0: q(x) of either kind. */
static inline float int8_round_clamp(float x, float inv, float lo, float hi)
{
    float q = rintf(x * inv);
    if (q != q)
        return 0.0f;
    return q > hi ? hi : q < lo ? lo : q;
}

/* q(x) above, given inv = 1 / s: of a signed (int8) tensor, and of an
 * unsigned (u8) one. */
static inline int8_t int8_quantize(float x, float inv)
{
    return (int8_t)int8_round_clamp(x, inv, -127.0f, 127.0f);
}

static inline uint8_t int8_quantize_u8(float x, float inv)
{
    return (uint8_t)int8_round_clamp(x, inv, 0.0f, 255.0f);
}

/* Quantises cout rows of K weights: q[c][i] and scale[c] as above. */
static inline void int8_quantize_weights(const float *w, int cout, int K, int8_t *q, float *scale)
{
    for (int c = 0; c < cout; c++) {
        const float *row = w + (size_t)c * K;
        float m = 0.0f;
        for (int i = 0; i < K; i++)
            if (fabsf(row[i]) > m)
                m = fabsf(row[i]);
        float s = m > 0.0f ? m / 127.0f : 1.0f;
        scale[c] = s;
        for (int i = 0; i < K; i++) {
            float v = rintf(row[i] / s);
            q[(size_t)c * K + i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

#endif
