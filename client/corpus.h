/* The images resnetd-load sends, read into memory before the run so the
 * load path never touches the disk. Each image also carries its multipart
 * part header, built once, so a multipart request is a list of iovecs over
 * shared memory. Read-only after loading: the load threads share it. */
#ifndef RESNETD_CORPUS_H
#define RESNETD_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *path;
    uint8_t *data;
    size_t len;
    char *part_head; /* "--BOUNDARY\r\nContent-Disposition: ...\r\n\r\n" */
    size_t part_head_len;
} corpus_image;

typedef struct {
    corpus_image *images;
    size_t n, cap;
    size_t bytes; /* sum of the images' sizes */
} corpus;

/* A directory adds its *.jpg and *.jpeg files (sorted by name, not
 * recursive); a file adds itself and must start like a JPEG. 0 or -1 with a
 * one-line reason in err. */
int corpus_add_path(corpus *c, const char *path, char *err, size_t errlen);

/* Adds each path listed in a file, one per line; blank lines and lines
 * starting with '#' are skipped. */
int corpus_add_list(corpus *c, const char *list, char *err, size_t errlen);

/* Builds every image's multipart part header for field "image". */
int corpus_prepare_multipart(corpus *c, const char *boundary, char *err, size_t errlen);

void corpus_free(corpus *c);

#endif
