/* Reads a small text file whole, for start-up files (the config, the
 * labels): only a regular file of at most `max` bytes is read, so
 * /dev/zero, a FIFO or a directory named by mistake fails at once with a
 * message instead of spinning, blocking or growing without bound. */
#ifndef RESNETD_TEXTFILE_H
#define RESNETD_TEXTFILE_H

#include <stddef.h>

/* On success *text is malloc'd, NUL-terminated after its *len bytes (which
 * may contain NULs: callers check), and 0 is returned. On failure -1 with
 * "PATH: reason" in err. */
int textfile_read(const char *path, size_t max, char **text, size_t *len, char *err, size_t errlen);

#endif
