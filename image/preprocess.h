/* JPEG bytes -> the 224x224 RGB crop torchvision makes.
 *
 * Reproduces torchvision's Resize(256) + CenterCrop(224) on a PIL image:
 * libjpeg-turbo decode (ISLOW DCT, fancy upsampling, as PIL; CMYK and YCCK
 * files turned into RGB as PIL's Image.convert("RGB") does), then PIL's
 * antialiased bilinear resample in 22-bit fixed point, horizontal pass then
 * vertical with uint8 rounding between, evaluated only for the cropped
 * pixels. Output is uint8 HWC; normalisation is preprocess_normalize().
 *
 * A preprocess context holds a libjpeg decompressor and scratch buffers and
 * is used by one thread at a time. Scratch grows to the largest image seen
 * (up to retain_bytes, beyond which it is freed after the image) and is
 * then reused, so steady state allocates nothing.
 *
 * Decode budget per image: at most 500 scans, and at most
 * PREPROCESS_WORK_PASSES full-colour passes' worth of DCT blocks over all
 * scans (relative to a max_pixels image); an optional stop hook is polled
 * during the decode (deadline, client gone). */
#ifndef RESNETD_PREPROCESS_H
#define RESNETD_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* also included by the CUDA sources */
#endif

#define PREPROCESS_RESIZE 256
#define PREPROCESS_CROP 224
#define PREPROCESS_DEFAULT_MAX_PIXELS (64u * 1024u * 1024u)
#define PREPROCESS_DEFAULT_RETAIN_BYTES (32u * 1024u * 1024u)
#define PREPROCESS_WORK_PASSES 16

typedef enum {
    PREP_OK = 0,
    PREP_ERR_EMPTY, /* zero bytes */
    PREP_ERR_NOT_JPEG, /* no SOI marker: PNG, text, ... */
    PREP_ERR_CORRUPT, /* bad or truncated JPEG data */
    PREP_ERR_TOO_LARGE, /* width x height over the pixel limit, or over the work budget */
    PREP_ERR_UNSUPPORTED, /* a colour space we do not convert (two components, say) */
    PREP_ERR_NOMEM,
    PREP_ERR_STOPPED, /* the stop hook asked to stop (deadline, client gone) */
} preprocess_status;

typedef struct preprocess_options {
    uint64_t max_pixels; /* 0: PREPROCESS_DEFAULT_MAX_PIXELS */
    int fast; /* DCT-domain downscale (1/2..1/8) of images at least 4x larger than
                            * needed, to a shorter side >= 512: not bit-exact */
    size_t retain_bytes; /* buffers kept between images; 0: PREPROCESS_DEFAULT_RETAIN_BYTES */
} preprocess_options;

typedef struct preprocess_ctx preprocess_ctx;

preprocess_ctx *preprocess_create(const preprocess_options *opt);
void preprocess_destroy(preprocess_ctx *p);

/* Decodes and crops one JPEG into out (224*224*3 bytes, HWC RGB). On error
 * writes a one-line reason to err. Never crashes on any input bytes. */
preprocess_status preprocess_jpeg(preprocess_ctx *p, const uint8_t *jpeg, size_t len, uint8_t *out, char *err,
                                  size_t errlen);

/* A hook polled during every decode on p (per iMCU row and output row
 * group: every few milliseconds at most): nonzero stops the decode with
 * PREP_ERR_STOPPED. NULL removes it. Called on the decoding thread. */
void preprocess_set_stop(preprocess_ctx *p, int (*stop)(void *cls), void *cls);

/* Bytes p holds now: its retained buffers, plus, while a decode runs, that
 * decode's buffers and libjpeg's coefficient store. Any thread may read it. */
size_t preprocess_ctx_bytes(const preprocess_ctx *p);

/* What preprocess_header reads. */
typedef struct preprocess_info {
    int w, h;
    int ycc; /* YCbCr or greyscale, which libjpeg converts to RGB as JFIF says (not Adobe RGB) */
    size_t decode_bytes; /* what preprocess_jpeg would hold for it: image, scratch, coefficients */
} preprocess_info;

/* The checks preprocess_jpeg makes before decoding (SOI, header, colour
 * space, pixel limit) without decoding, for a path that decodes elsewhere:
 * the same statuses and messages; fills *info on PREP_OK. */
preprocess_status preprocess_header(preprocess_ctx *p, const uint8_t *jpeg, size_t len, preprocess_info *info,
                                    char *err, size_t errlen);

/* Where the resample of a w x h image goes: the resized size, the crop's
 * top-left corner in it, and Pillow's taps per output pixel on each axis
 * (ksize), which bounds another implementation's coefficient storage. */
typedef struct preprocess_geom {
    int rw, rh, left, top;
    int ksize_x, ksize_y;
} preprocess_geom;
void preprocess_geometry(int w, int h, preprocess_geom *g);

/* Stable short name for a status ("invalid_jpeg", "too_large", ...). */
const char *preprocess_status_code(preprocess_status s);

/* The PIL-exact resample and crop, exposed for tests: src is w x h RGB. */
void preprocess_resize_crop(const uint8_t *src, int w, int h, uint8_t *out, uint8_t *scratch);
size_t preprocess_scratch_bytes(int w, int h);

/* ImageNet mean/std normalisation, as torchvision's ToTensor + Normalize in
 * FP32: hwc uint8 [224][224][3] -> chw float [3][224][224]. */
void preprocess_normalize_chw(const uint8_t *hwc, float *chw);
/* The same mapping tabulated: lut[c][v] is channel c's normalised value v. */
void preprocess_normalize_lut(float lut[3][256]);
extern const float preprocess_mean[3];
extern const float preprocess_std[3];

#ifdef __cplusplus
}
#endif

#endif
