/* libFuzzer target: the safetensors loader (header JSON, offsets, dtypes,
 * shapes, the tensor checks and BN folding) on arbitrary file contents,
 * through weights_load on a memfd, as resnetd reads a weights file. */
#define _GNU_SOURCE /* memfd_create */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "model/resnet18.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz-weights", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0)
            abort();
        off += (size_t)n;
    }
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    resnet18_weights w;
    if (weights_load(path, &w, err, sizeof err) == 0)
        weights_free(&w);
    else if (!err[0])
        abort();
    close(fd);
    return 0;
}
