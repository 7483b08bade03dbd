/* Whole-file reads of small start-up files, refusing what is not one. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/textfile.h"

int textfile_read(const char *path, size_t max, char **text, size_t *len, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t n = 0;
    *text = NULL;
    *len = 0;
    /* O_NONBLOCK: open() on a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto err;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto err;
    }
    if ((unsigned long long)st.st_size > max) {
        snprintf(err, errlen, "%s: larger than %zu bytes", path, max);
        goto err;
    }
    /* One byte more than the limit, to notice a file that grew meanwhile. */
    if (!(buf = malloc(max + 2))) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto err;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            goto err;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max) {
            snprintf(err, errlen, "%s: larger than %zu bytes", path, max);
            goto err;
        }
    }
    close(fd);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
err:
    free(buf);
    close(fd);
    return -1;
}
