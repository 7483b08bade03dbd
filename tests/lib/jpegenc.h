/* Test JPEGs in any sampling layout, with or without restart markers:
 * libjpeg's encoder, where TurboJPEG 2.1's offers neither 4:1:0 nor DRI. */
#ifndef RESNETD_TESTS_JPEGENC_H
#define RESNETD_TESTS_JPEGENC_H

#include <stddef.h>
#include <stdint.h>

/* rgb (w x h, interleaved) as a baseline JPEG with luma sampled hs x vs
 * (chroma 1x1; 1x1 luma is 4:4:4), the given quality, a restart marker
 * every `restart` MCUs (0: none). malloc'd, its size in *len; aborts the
 * test on failure. */
uint8_t *jpegenc_layout(const uint8_t *rgb, int w, int h, int hs, int vs, int restart, int quality, size_t *len);

#endif
