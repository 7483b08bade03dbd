/* JPEG bytes -> the 224x224 RGB crop torchvision makes.
 *
 * Reproduces torchvision's Resize(256) + CenterCrop(224) on a PIL image:
 * libjpeg-turbo decode (ISLOW DCT, fancy upsampling, as PIL), then PIL's
 * antialiased bilinear resample in 22-bit fixed point, horizontal pass then
 * vertical with uint8 rounding between, evaluated only for the cropped
 * pixels. Output is uint8 HWC; normalisation is preprocess_normalize().
 *
 * A preprocess context holds a TurboJPEG handle and scratch buffers and is
 * used by one thread at a time. Scratch grows to the largest image seen and
 * is then reused, so steady state allocates nothing. */
#ifndef RESNETD_PREPROCESS_H
#define RESNETD_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#define PREPROCESS_RESIZE 256
#define PREPROCESS_CROP 224
#define PREPROCESS_DEFAULT_MAX_PIXELS (64u * 1024u * 1024u)

typedef enum {
    PREP_OK = 0,
    PREP_ERR_EMPTY,        /* zero bytes */
    PREP_ERR_NOT_JPEG,     /* no SOI marker: PNG, text, ... */
    PREP_ERR_CORRUPT,      /* bad or truncated JPEG data */
    PREP_ERR_TOO_LARGE,    /* width x height over the pixel limit */
    PREP_ERR_UNSUPPORTED,  /* CMYK/YCCK, or a colourspace we do not convert */
    PREP_ERR_NOMEM,
} preprocess_status;

typedef struct preprocess_options {
    uint64_t max_pixels;   /* 0: PREPROCESS_DEFAULT_MAX_PIXELS */
    int fast;              /* DCT-domain downscale when >= 2x larger than needed */
} preprocess_options;

typedef struct preprocess_ctx preprocess_ctx;

preprocess_ctx *preprocess_create(const preprocess_options *opt);
void preprocess_destroy(preprocess_ctx *p);

/* Decodes and crops one JPEG into out (224*224*3 bytes, HWC RGB). On error
 * writes a one-line reason to err. Never crashes on any input bytes. */
preprocess_status preprocess_jpeg(preprocess_ctx *p, const uint8_t *jpeg, size_t len,
                                  uint8_t *out, char *err, size_t errlen);

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

#endif
