/* Shared helpers for the Check test programs: where the reference data is,
 * reading files, comparing tensors, running a suite. */
#ifndef RESNETD_TESTUTIL_H
#define RESNETD_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* The reference directory written by tests/reference.py, or exits: 77
 * (skip) when it is missing, 1 when RESNETD_REQUIRE_REFERENCE=1 (CI). */
const char *testutil_require_reference(void);

/* ref_dir/name in a static buffer (one at a time). */
const char *testutil_ref_path(const char *name);

/* Whole file into malloc'd memory, a NUL after it (text can be searched
 * as a string); NULL on error. */
uint8_t *testutil_read_file(const char *path, size_t *len);

/* ||a - b|| / ||b|| over n floats, in double. */
double testutil_rel_l2(const float *a, const float *b, size_t n);

/* n images of `classes` logits, got, against nref candidate references
 * ref[r] (named names[r]) of which ref[own] is the one got should match:
 * per image rel L2 <= tol_image and the mean over the images <= tol_mean
 * against ref[own], and the mean against every other candidate more than
 * 3 times that against ref[own], so that got could not pass for another
 * candidate (a setting the engine ignored fails: it is then as near another
 * reference as the references are to each other, or exactly on it).
 * Prints the means, naming `what`. */
void testutil_expect_nearest(const float *got, const float *const *ref, const char *const *names, int nref, int own,
                             int n, int classes, double tol_mean, double tol_image, const char *what);

/* The file (under the reference directory; testutil_ref_path gives its
 * path) of tests/reference.py's emulated logits of random_u8.npy at the
 * precision mix named mix (engine/calib.h's calib_mix_name), in a static
 * buffer. "int8": engine/int8.h's, exact;
 * a float mix: its float prefix in FP32 (fp16 0, the CPU engine's) or in
 * FP16 (the CUDA engine's). */
const char *testutil_mix_logits(const char *mix, int fp16);

/* Indices of the k largest values, best first. */
void testutil_topk(const float *v, int n, int k, int *idx);

/* xorshift64: the next 32 random bits of *state (seeded non-zero); the
 * same sequence on every machine, so a failing trial can be replayed. */
uint32_t testutil_rand_u32(uint64_t *state);
/* From the same sequence: uniform in [-a, a); n of them in a malloc'd
 * array (asserted); an int8 in [-127, 127]. */
float testutil_rand_float(uint64_t *state, float a);
float *testutil_rand_array(uint64_t *state, size_t n, float a);
int8_t testutil_rand_s8(uint64_t *state);

/* engine/int8.h's epilogue of one output, as the CPU INT8 engine computes
 * it (the build compiles C with -ffp-contract=off): acc * mult + bias
 * (+ *res * res_scale, *res read as u8 when res_u8), then the ReLU; res
 * may be NULL. */
float testutil_int8_epilogue(int32_t acc, float mult, float bias, const int8_t *res, int res_u8, float res_scale,
                             int relu);

/* ||a - b|| / ||b|| with the reference b in double. */
double testutil_rel_l2_d(const float *a, const double *b, size_t n);

/* An FP16 value's bits as a float (subnormals, infinities, NaN). */
float testutil_half_bits(uint16_t h);

/* Runs s without forking when CK_FORK=no, returns main()'s exit status. */
int testutil_run(Suite *s);

#endif
