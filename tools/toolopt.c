/* The tools' shared options and loading (tools/toolopt.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/toolopt.h"

int toolopt_device(const char *prog, const char *arg, engine_config *c)
{
    if (engine_parse_device(arg, &c->device, &c->device_index) == 0)
        return 0;
    fprintf(stderr, "%s: --device must be cpu, cuda, cuda:N or auto, got '%s'\n", prog, arg);
    return -1;
}

int toolopt_precision(const char *prog, const char *arg, engine_config *c)
{
    if (engine_parse_precision(arg, &c->precision) == 0)
        return 0;
    fprintf(stderr, "%s: --precision must be fp32, fp16 or int8, got '%s'\n", prog, arg);
    return -1;
}

int toolopt_tuning(const char *prog, const char *arg, engine_config *c)
{
    char err[256];
    if (engine_tuning_parse(arg, &c->tuning, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "%s: --gpu-tuning: %s\n", prog, err);
    return -1;
}

int toolopt_load_weights(const char *prog, const char *path, resnet18_weights *w)
{
    char err[8192]; /* room for two full paths */
    int rc = strcmp(path, "synthetic") == 0 ? weights_synthetic(WEIGHTS_SYNTHETIC_SEED, w, err, sizeof err)
                                            : weights_load(path, w, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%s: %s\n", prog, err);
    return rc != 0 ? -1 : 0;
}

int toolopt_load_calibration(const char *prog, const char *path, const resnet18_weights *w, const char *weights_path,
                             calib_table *t)
{
    char err[8192]; /* room for two full paths */
    if (calib_load(path, t, err, sizeof err) == 0 &&
        calib_check_weights(t, path, w, weights_path, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "%s: %s\n", prog, err);
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double toolopt_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
