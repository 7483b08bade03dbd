/* The served model: weights, labels and what they are.
 *
 * A served_model is immutable and reference counted: the pipeline hands
 * each image's result over with the model that computed it, and a request
 * holds those references until it is answered, so an answer always names
 * the labels and weights its logits came from, even across a reload
 * (daemon/pipeline/reload.h). */
#ifndef RESNETD_SERVED_MODEL_H
#define RESNETD_SERVED_MODEL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "daemon/config_table.h"
#include "engine/calib.h"
#include "model/labels.h"
#include "model/resnet18.h"

typedef struct served_model {
    atomic_int refs;
    int version; /* 1 at start-up, then +1 per successful reload */
    int synthetic; /* weights = synthetic: answers are marked */
    int classes; /* the weights' head: logits per image, top_k's bound */
    labels lab; /* lab.count == classes */
    char weights_path[CONFIG_PATH_MAX];
    char labels_path[CONFIG_PATH_MAX];
    char sha256[65]; /* of the weights file; "" for synthetic */
    int64_t loaded_unix_ms; /* wall clock when it was loaded */
    /* INT8: the calibration's method ("entropy", "percentile 99.99"; ""
     * at other precisions), its precision mix and what its check measured
     * (images 0: none). */
    char int8_calibration[48];
    calib_mix int8_mix;
    calib_check int8_check;
} served_model;

/* Loads c's labels and weights: the model (one reference, the caller's)
 * and its weights in *w, which the engine is built from. NULL with the
 * reason in err and, when key is not NULL, the option at fault in *key
 * ("weights" or "labels"). */
served_model *served_model_load(const config *c, int version, resnet18_weights *w, const char **key, char *err,
                                size_t errlen);
/* Records INT8 table t's method, mix and check in m, before m is shared. */
void served_model_set_int8(served_model *m, const calib_table *t);
/* The served table's mix ("int8", "float:layer1", ...); NULL when m is not
 * served at INT8. */
const char *served_model_int8_mix(const served_model *m);
served_model *served_model_ref(served_model *m);
void served_model_unref(served_model *m);

#endif
