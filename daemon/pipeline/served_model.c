/* The served model (daemon/pipeline/served_model.h): loading and reference counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "config.h"
#include "daemon/log.h"
#include "daemon/pipeline/served_model.h"

/* The labels file: --labels, else labels_default_path() (the installed
 * copy, or the source tree's when resnetd runs uninstalled). */
static const char *labels_path(const config *c)
{
    if (c->labels[0])
        return c->labels;
    const char *p = labels_default_path();
    if (strncmp(p, RESNETD_DATADIR "/", strlen(RESNETD_DATADIR "/")) != 0)
        log_info("not installed: using labels from %s", p);
    return p;
}

served_model *served_model_load(const config *c, int version, resnet18_weights *w, const char **key, char *err,
                                size_t errlen)
{
    const char *unused;
    if (!key)
        key = &unused;
    *key = "weights";
    served_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory loading the model");
        return NULL;
    }
    /* Weights first: their head sets how many class names the labels need. */
    m->synthetic = strcmp(c->weights, "synthetic") == 0;
    int rc = m->synthetic ? weights_synthetic(WEIGHTS_SYNTHETIC_SEED, w, err, errlen)
                          : weights_load(c->weights, w, err, errlen);
    if (rc != 0) {
        free(m);
        return NULL;
    }
    const char *lpath = labels_path(c);
    char lerr[1024];
    if (labels_load(lpath, w->classes, &m->lab, lerr, sizeof lerr) != 0) {
        *key = "labels";
        snprintf(err, errlen, "%s; weights %.300s", lerr, c->weights);
        weights_free(w);
        free(m);
        return NULL;
    }
    m->classes = w->classes;
    atomic_init(&m->refs, 1);
    m->version = version;
    snprintf(m->weights_path, sizeof m->weights_path, "%s", c->weights);
    snprintf(m->labels_path, sizeof m->labels_path, "%s", lpath);
    snprintf(m->sha256, sizeof m->sha256, "%s", w->sha256);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->loaded_unix_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    return m;
}

void served_model_set_int8(served_model *m, const calib_table *t)
{
    calib_method_label(t->method, t->percentile, m->int8_calibration, sizeof m->int8_calibration);
    m->int8_mix = t->mix;
    m->int8_check = t->check;
}

const char *served_model_int8_mix(const served_model *m)
{
    return m->int8_calibration[0] ? calib_mix_name(m->int8_mix) : NULL;
}

served_model *served_model_ref(served_model *m)
{
    if (m)
        atomic_fetch_add(&m->refs, 1);
    return m;
}

void served_model_unref(served_model *m)
{
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        labels_free(&m->lab);
        free(m);
    }
}
