/* ResNet18's topology and its BatchNorm-folded FP32 parameters.
 *
 * The network is described once here, as a table of 20 convolutions in
 * execution order; every engine walks this table. Weights are KRSC
 * ([cout][kh][kw][cin]) FP32 with each BatchNorm folded into the conv's
 * weight and bias. Activations are NHWC. */
#ifndef RESNETD_RESNET18_H
#define RESNETD_RESNET18_H

#include <stddef.h>
#include <stdint.h>

#define RESNET18_NUM_CONVS 20
#define RESNET18_IMG 224 /* input height and width */
#define RESNET18_FEATURES 512 /* channels into the FC layer */
/* The class count is the loaded weights' (fc.weight is [classes][512]):
 * fine-tuned heads have any number. ImageNet's 1000 is only what synthetic
 * weights get; the bound keeps a corrupt header from asking for gigabytes. */
#define RESNET18_IMAGENET_CLASSES 1000
#define RESNET18_MAX_CLASSES 100000
#define RESNET18_INPUT_BYTES (RESNET18_IMG * RESNET18_IMG * 3)

/* Where a convolution reads its input or its residual from: an index into
 * the conv table (that conv's output), or one of these. */
#define R18_IMAGE (-3) /* the normalised input image */
#define R18_POOL (-1) /* the stem's 3x3/2 maxpool output, 56x56x64 */
#define R18_NONE (-2) /* no residual */
typedef struct resnet18_conv_desc {
    const char *name; /* torchvision prefix, e.g. "layer2.0.conv1" */
    const char *bn; /* its BatchNorm prefix, e.g. "layer2.0.bn1" */
    int cin, cout, k, stride, pad;
    int in_h; /* input height (= width) at 224x224 */
    int out_h; /* output height (= width) */
    int src; /* this conv's input: a conv index, R18_IMAGE or R18_POOL */
    int residual; /* added before ReLU: a conv index, R18_POOL or R18_NONE */
    int relu; /* apply ReLU after bias (+ residual) */
} resnet18_conv_desc;

/* conv 0 is the stem (7x7/2 + ReLU), followed by a 3x3/2 pad-1 maxpool. */
extern const resnet18_conv_desc resnet18_convs[RESNET18_NUM_CONVS];

/* The graph's tensors as the CPU engines number them: conv i's output is
 * tensor i, then the image and the max pool's output. Each has a side
 * (height = width), channels, and the steps it lives between (0 the
 * image, 1 the stem, 2 the max pool, i + 2 conv i for i >= 1). */
#define R18_NTENSORS (RESNET18_NUM_CONVS + 2)
#define R18_T_IMAGE RESNET18_NUM_CONVS
#define R18_T_POOL (RESNET18_NUM_CONVS + 1)
typedef struct resnet18_tensors {
    int h[R18_NTENSORS], c[R18_NTENSORS];
    int born[R18_NTENSORS]; /* the step that writes it */
    int last_use[R18_NTENSORS]; /* the last step that reads it, -1 none */
} resnet18_tensors;

/* A conv table index, R18_IMAGE or R18_POOL as a tensor number. */
int resnet18_tensor_id(int x);

/* Walks the conv table: shapes chain, residuals match, every cout is a
 * multiple of cout_multiple, the last conv gives RESNET18_FEATURES.
 * Returns 0, or -1 with the reason in err. */
int resnet18_plan_tensors(resnet18_tensors *t, int cout_multiple, char *err, size_t errlen);

/* Gives tensors order[0..n) in turn a buffer (buf[tensor]), reusing one
 * whose tensor's last read comes before the new tensor is written;
 * per_image[b] is the largest elems[tensor] buffer b holds. Returns the
 * buffer count. */
int resnet18_share_buffers(const resnet18_tensors *t, const int *order, int n, const size_t *elems, int *buf,
                           size_t *per_image);

typedef struct resnet18_conv {
    float *w; /* [cout][k][k][cin], BN folded */
    float *b; /* [cout], BN folded */
} resnet18_conv;

typedef struct resnet18_weights {
    resnet18_conv conv[RESNET18_NUM_CONVS];
    int classes; /* 1..RESNET18_MAX_CLASSES, from fc.weight's shape */
    float *fc_w; /* [classes][512] */
    float *fc_b; /* [classes] */
    char sha256[65]; /* hex digest of the weights file, "" for synthetic */
    int synthetic; /* 1 when made by weights_synthetic() */
} resnet18_weights;

/* Loads a safetensors file with torchvision's resnet18 names, validates
 * every tensor, and folds BN (eps 1e-5). The class count is fc.weight's
 * first dimension; fc.bias must match it. Returns 0, or -1 with a one-line
 * message naming the file and the problem in err. */
int weights_load(const char *path, resnet18_weights *w, char *err, size_t errlen);

/* Seeded random weights with sensible scales and ImageNet's 1000 classes,
 * for load tests only. */
int weights_synthetic(uint64_t seed, resnet18_weights *w, char *err, size_t errlen);
/* The seed of `--weights synthetic` in every program (the daemon,
 * resnetd-classify, -bench, -calibrate): the same weights, so their answers
 * and a calibration table made for them agree. */
#define WEIGHTS_SYNTHETIC_SEED 1u

void weights_free(resnet18_weights *w);

/* Multiply-accumulates per image with a head of `classes` (for TFLOP/s reports). */
double resnet18_macs_per_image(int classes);

#endif
