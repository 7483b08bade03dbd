/* Helpers shared by the weights test programs (test_weights,
 * test_weights_reference) and tests/util/test_sha256: a scratch directory,
 * the sha256sum tool's digest, binary16 decoding and the fold's tolerance. */
#ifndef RESNETD_WEIGHTS_TESTUTIL_H
#define RESNETD_WEIGHTS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Makes /tmp/NAME.XXXXXX, the directory tmp_path names files in; 0, or -1
 * with errno set. */
int tmpdir_make(const char *name);

/* Empties and removes that directory. Passing tests unlink their files; a
 * failed one may leave its file behind, so main calls this after the run
 * (not atexit, which the forked test children would run too). */
void tmpdir_remove(void);

/* The directory itself. */
const char *tmp_dir(void);

/* The directory's path for name, in one of four rotating static buffers. */
const char *tmp_path(const char *name);

/* Writes n bytes to path (asserted). */
void write_bytes(const char *path, const void *b, size_t n);

/* The sha256sum tool's digest of path, as an outside check of ours. */
void sha256sum(const char *path, char hex[65]);

/* binary16 bits to value, by the definition (finite values only). */
double half_value(uint16_t h);

/* a equals b or is its float neighbour: the fold may round its double
 * product in a different order than the check does. */
int near_ulp(float a, float b);

#endif
