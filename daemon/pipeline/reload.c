/* The reloader thread (see reload.h). */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "config.h"
#include "daemon/pipeline/infer.h"
#include "daemon/api/jsonout.h"
#include "daemon/log.h"
#include "daemon/api/metrics.h"
#include "daemon/notify.h"
#include "daemon/pipeline/reload.h"
#include "engine/calib.h"
#include "util/clock.h"
#include "engine/engine.h"
#include "engine/engine_registry.h"

#define RELOAD_MAX_WAITING 64 /* load requests waiting at once; more are refused */

int reload_parse_request(const uint8_t *body, size_t len, char *why, size_t whylen)
{
    if (len == 0)
        return 0;
    json_error_t e;
    json_t *j = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &e);
    int rc = -1;
    if (!j)
        snprintf(why, whylen, "the body is not JSON: %s (at byte %d)", json_error_for_client(&e), e.position);
    else if (!json_is_object(j))
        snprintf(why, whylen, "the body must be a JSON object");
    else {
        json_t *p = json_object_get(j, "parameters");
        if (p && !json_is_object(p))
            snprintf(why, whylen, "\"parameters\" must be an object");
        else if (p && json_object_size(p) > 0)
            snprintf(why, whylen,
                     "load parameters are not supported: resnetd loads the weights and labels its "
                     "configuration names (edit it, then load)");
        else
            rc = 0;
    }
    json_decref(j);
    return rc;
}

/* ---- the reloader -------------------------------------------------------- */

typedef struct waiter {
    reload_done_fn done;
    void *cls;
} waiter;

struct reloader {
    int argc;
    char **argv;
    config given; /* as start-up read it, before "auto" was resolved */
    infer *const *inf; /* one per engine */
    int ninf;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    waiter waiting[RELOAD_MAX_WAITING];
    int nwaiting;
    int asked; /* a reload is due (SIGHUP asks with no waiter) */
    int draining; /* the server drains: no new reload starts */
    int stopping;
};

/* Names the options whose new value differs from the one start-up read and
 * that a reload does not apply (everything but weights and labels). */
static void warn_unapplied(const config *given, const config *fresh)
{
    int n;
    const config_option *opts = config_options(&n);
    char names[512] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const config_option *o = &opts[i];
        if (strcmp(o->name, "weights") == 0 || strcmp(o->name, "labels") == 0)
            continue;
        const char *a = (const char *)given + o->offset, *b = (const char *)fresh + o->offset;
        int same = o->type == CONFIG_STRING ? strcmp(a, b) == 0 : *(const long *)a == *(const long *)b;
        if (!same && used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", o->name);
    }
    if (used)
        log_warn("reload: changed option(s) %s need a restart; not applied", names);
}

/* One reload; 0, or -1 with why in err. */
static int reload_once(reloader *rl, char *msg, size_t msglen)
{
    char err[1024];
    config fresh;
    config_cli cli;
    if (config_load(&fresh, &cli, rl->argc, rl->argv, err, sizeof err) != 0 ||
        config_validate(&fresh, err, sizeof err) != 0) {
        snprintf(msg, msglen, "configuration: %s%s%s", cli.config_path ? cli.config_path : "",
                 cli.config_path ? ": " : "", err);
        return -1;
    }
    warn_unapplied(&rl->given, &fresh);

    served_model *old_model = infer_model(rl->inf[0]);
    int version = old_model->version + 1;
    served_model_unref(old_model);
    uint64_t t0 = clock_now_us();
    resnet18_weights w;
    const char *key;
    served_model *m = served_model_load(&fresh, version, &w, &key, err, sizeof err);
    if (!m) {
        snprintf(msg, msglen, "%s: %s", key, err);
        return -1;
    }
    /* INT8 engines need the calibration table the configuration names now,
     * made for the new weights (a table for the old ones is refused: its
     * scales would not fit). Engines copy its scales. */
    calib_table calib;
    int int8 = infer_engine(rl->inf[0])->precision == ENGINE_PRECISION_INT8;
    if (int8 && (calib_load(fresh.calibration, &calib, err, sizeof err) != 0 ||
                 calib_check_weights(&calib, fresh.calibration, &w, fresh.weights, err, sizeof err) != 0)) {
        snprintf(msg, msglen, "%s", err);
        weights_free(&w);
        served_model_unref(m);
        return -1;
    }
    if (int8)
        served_model_set_int8(m, &calib);
    /* Every new engine is built and warmed up before any is swapped in, so
     * a failure leaves all engines on the old model. Engines copy the
     * weights: w is freed once they are built. */
    engine *e[ENGINE_MAX_DEVICES] = { 0 };
    int built = 0;
    for (; built < rl->ninf; built++) {
        engine *cur = infer_engine(rl->inf[built]);
        engine_config ec = { .device = cur->device,
                             .device_index = cur->device_index,
                             .precision = cur->precision,
                             .max_batch = cur->max_batch,
                             .nslots = cur->nslots,
                             .threads = (int)rl->given.engine_threads,
                             .calib = int8 ? &calib : NULL,
                             .deterministic = config_bool(rl->given.deterministic) };
        if (engine_tuning_parse(rl->given.gpu_tuning, &ec.tuning, err, sizeof err) != 0) {
            snprintf(msg, msglen, "gpu_tuning: %s", err);
            goto fail;
        }
        char label[32];
        infer_engine_label(cur, label, sizeof label);
        if (!(e[built] = engine_create(&w, &ec, err, sizeof err))) {
            snprintf(msg, msglen, "engine on %s: %s", label, err);
            goto fail;
        }
        if (engine_warm_up(e[built], err, sizeof err) != 0) {
            snprintf(msg, msglen, "warm-up batch on %s: %s", label, err);
            built++;
            goto fail;
        }
    }
    weights_free(&w);
    for (int i = 0; i < rl->ninf; i++) {
        engine *old;
        if (infer_swap(rl->inf[i], e[i], m, &old, err, sizeof err) != 0) {
            /* Only when stopping, or a new engine unlike the old: those
             * swapped already serve the new model, the rest the old. */
            snprintf(msg, msglen, "swap: %s", err);
            for (int k = i; k < rl->ninf; k++)
                engine_destroy(e[k]);
            served_model_unref(m);
            return -1;
        }
        engine_destroy(old);
    }
    snprintf(msg, msglen,
             "model version %d: weights %.300s (sha256 %s), labels %.300s; loaded and warmed up in %.0f ms", m->version,
             m->weights_path, m->synthetic ? "none: synthetic" : m->sha256, m->labels_path,
             (double)(clock_now_us() - t0) / 1e3);
    metrics_set_model(m->version, (double)m->loaded_unix_ms / 1e3);
    metrics_set_int8(served_model_int8_mix(m), &m->int8_check);
    served_model_unref(m);
    return 0;
fail:
    for (int i = 0; i < built; i++)
        engine_destroy(e[i]);
    weights_free(&w);
    served_model_unref(m);
    return -1;
}

static void *reloader_main(void *arg)
{
    reloader *rl = arg;
    waiter batch[RELOAD_MAX_WAITING];
    pthread_mutex_lock(&rl->mu);
    for (;;) {
        while ((!rl->asked || rl->draining) && !rl->stopping)
            pthread_cond_wait(&rl->cv, &rl->mu);
        if (rl->stopping)
            break;
        /* Everyone waiting now is served by this reload; later askers by the next. */
        int n = rl->nwaiting;
        memcpy(batch, rl->waiting, (size_t)n * sizeof *batch);
        rl->nwaiting = 0;
        rl->asked = 0;
        pthread_mutex_unlock(&rl->mu);

        char msg[1536];
        log_info("reload: loading");
        notify_send("RELOADING=1"); /* systemd shows the unit reloading until READY=1 */
        int rc = reload_once(rl, msg, sizeof msg);
        pthread_mutex_lock(&rl->mu);
        int draining = rl->draining;
        pthread_mutex_unlock(&rl->mu);
        if (!draining) /* after STOPPING=1, READY=1 would tell systemd the opposite */
            notify_send("READY=1");
        metrics_add_model_load(rc == 0);
        if (rc == 0)
            log_info("reload: now serving %s", msg);
        else
            log_error("reload failed, the running model keeps serving: %s", msg);
        for (int i = 0; i < n; i++)
            batch[i].done(batch[i].cls, rc, msg);
        pthread_mutex_lock(&rl->mu);
    }
    pthread_mutex_unlock(&rl->mu);
    return NULL;
}

reloader *reloader_start(int argc, char **argv, const config *given, infer *const *inf, int ninf, char *err,
                         size_t errlen)
{
    reloader *rl = calloc(1, sizeof *rl);
    if (!rl) {
        snprintf(err, errlen, "reloader: out of memory");
        return NULL;
    }
    rl->argc = argc;
    rl->argv = argv;
    rl->given = *given;
    rl->inf = inf;
    rl->ninf = ninf;
    if (pthread_mutex_init(&rl->mu, NULL) != 0 || pthread_cond_init(&rl->cv, NULL) != 0) {
        snprintf(err, errlen, "reloader: cannot create its lock");
        free(rl);
        return NULL;
    }
    int rc = pthread_create(&rl->thread, NULL, reloader_main, rl);
    if (rc != 0) {
        snprintf(err, errlen, "reloader: cannot start thread: %s", strerror(rc));
        pthread_cond_destroy(&rl->cv);
        pthread_mutex_destroy(&rl->mu);
        free(rl);
        return NULL;
    }
    return rl;
}

int reloader_request(reloader *rl, reload_done_fn done, void *cls)
{
    pthread_mutex_lock(&rl->mu);
    int rc = -1;
    if (!rl->stopping && !rl->draining && (!done || rl->nwaiting < RELOAD_MAX_WAITING)) {
        if (done)
            rl->waiting[rl->nwaiting++] = (waiter){ done, cls };
        rl->asked = 1;
        pthread_cond_signal(&rl->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&rl->mu);
    return rc;
}

void reloader_drain(reloader *rl)
{
    waiter refused[RELOAD_MAX_WAITING];
    pthread_mutex_lock(&rl->mu);
    rl->draining = 1;
    int n = rl->nwaiting;
    memcpy(refused, rl->waiting, (size_t)n * sizeof *refused);
    rl->nwaiting = 0;
    pthread_mutex_unlock(&rl->mu);
    for (int i = 0; i < n; i++)
        refused[i].done(refused[i].cls, RELOAD_REFUSED, "the server is shutting down");
}

void reloader_stop(reloader *rl)
{
    if (!rl)
        return;
    pthread_mutex_lock(&rl->mu);
    rl->stopping = 1;
    pthread_cond_signal(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    pthread_join(rl->thread, NULL);
    for (int i = 0; i < rl->nwaiting; i++)
        rl->waiting[i].done(rl->waiting[i].cls, RELOAD_REFUSED, "the server is shutting down");
    rl->nwaiting = 0;
}

void reloader_destroy(reloader *rl)
{
    if (!rl)
        return;
    pthread_cond_destroy(&rl->cv);
    pthread_mutex_destroy(&rl->mu);
    free(rl);
}
