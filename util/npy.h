/* Minimal NumPy .npy reader and writer (version 1.0, C order, little endian),
 * for --dump-input and for reading reference tensors in tests. */
#ifndef RESNETD_NPY_H
#define RESNETD_NPY_H

#include <stddef.h>

#define NPY_MAX_DIMS 4

typedef struct npy_array {
    char dtype[8]; /* "<f4", "|u1" */
    int ndim;
    size_t shape[NPY_MAX_DIMS];
    size_t count; /* product of shape */
    void *data; /* malloc'd */
} npy_array;

int npy_write_f32(const char *path, const float *data, int ndim, const size_t *shape, char *err, size_t errlen);
int npy_read(const char *path, npy_array *a, char *err, size_t errlen);
void npy_free(npy_array *a);

#endif
