/* libjpeg encoding for the tests: see jpegenc.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <check.h>
#include <jpeglib.h>
#include "tests/lib/jpegenc.h"

uint8_t *jpegenc_layout(const uint8_t *rgb, int w, int h, int hs, int vs, int restart, int quality, size_t *len)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *buf = NULL;
    unsigned long n = 0;
    c.err = jpeg_std_error(&e); /* errors here are the test's own: exit */
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    c.comp_info[0].h_samp_factor = hs;
    c.comp_info[0].v_samp_factor = vs;
    for (int ci = 1; ci < 3; ci++)
        c.comp_info[ci].h_samp_factor = c.comp_info[ci].v_samp_factor = 1;
    c.restart_interval = (unsigned int)restart;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    uint8_t *out = malloc(n);
    ck_assert_ptr_nonnull(out);
    memcpy(out, buf, n);
    free(buf);
    *len = n;
    return out;
}
