/* The ResNet18 topology table: 20 convolutions in execution order, and
 * the tensor plan (shapes, lifetimes, shared buffers) the CPU engines use. */
#include <stdio.h>
#include "model/resnet18.h"

/* Block structure (BasicBlock): out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
 * In each layer's first block of layers 2..4 the shortcut is a 1x1/2 conv
 * (downsample), which runs before conv2 so conv2 can add it in its epilogue. */
const resnet18_conv_desc resnet18_convs[RESNET18_NUM_CONVS] = {
    /* name               bn                  cin  cout k s p  in  out src res relu */
    { "conv1", "bn1", 3, 64, 7, 2, 3, 224, 112, R18_IMAGE, R18_NONE, 1 },
    { "layer1.0.conv1", "layer1.0.bn1", 64, 64, 3, 1, 1, 56, 56, R18_POOL, R18_NONE, 1 },
    { "layer1.0.conv2", "layer1.0.bn2", 64, 64, 3, 1, 1, 56, 56, 1, R18_POOL, 1 },
    { "layer1.1.conv1", "layer1.1.bn1", 64, 64, 3, 1, 1, 56, 56, 2, R18_NONE, 1 },
    { "layer1.1.conv2", "layer1.1.bn2", 64, 64, 3, 1, 1, 56, 56, 3, 2, 1 },
    { "layer2.0.conv1", "layer2.0.bn1", 64, 128, 3, 2, 1, 56, 28, 4, R18_NONE, 1 },
    { "layer2.0.downsample.0", "layer2.0.downsample.1", 64, 128, 1, 2, 0, 56, 28, 4, R18_NONE, 0 },
    { "layer2.0.conv2", "layer2.0.bn2", 128, 128, 3, 1, 1, 28, 28, 5, 6, 1 },
    { "layer2.1.conv1", "layer2.1.bn1", 128, 128, 3, 1, 1, 28, 28, 7, R18_NONE, 1 },
    { "layer2.1.conv2", "layer2.1.bn2", 128, 128, 3, 1, 1, 28, 28, 8, 7, 1 },
    { "layer3.0.conv1", "layer3.0.bn1", 128, 256, 3, 2, 1, 28, 14, 9, R18_NONE, 1 },
    { "layer3.0.downsample.0", "layer3.0.downsample.1", 128, 256, 1, 2, 0, 28, 14, 9, R18_NONE, 0 },
    { "layer3.0.conv2", "layer3.0.bn2", 256, 256, 3, 1, 1, 14, 14, 10, 11, 1 },
    { "layer3.1.conv1", "layer3.1.bn1", 256, 256, 3, 1, 1, 14, 14, 12, R18_NONE, 1 },
    { "layer3.1.conv2", "layer3.1.bn2", 256, 256, 3, 1, 1, 14, 14, 13, 12, 1 },
    { "layer4.0.conv1", "layer4.0.bn1", 256, 512, 3, 2, 1, 14, 7, 14, R18_NONE, 1 },
    { "layer4.0.downsample.0", "layer4.0.downsample.1", 256, 512, 1, 2, 0, 14, 7, 14, R18_NONE, 0 },
    { "layer4.0.conv2", "layer4.0.bn2", 512, 512, 3, 1, 1, 7, 7, 15, 16, 1 },
    { "layer4.1.conv1", "layer4.1.bn1", 512, 512, 3, 1, 1, 7, 7, 17, R18_NONE, 1 },
    { "layer4.1.conv2", "layer4.1.bn2", 512, 512, 3, 1, 1, 7, 7, 18, 17, 1 },
};

double resnet18_macs_per_image(int classes)
{
    double macs = 0;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *c = &resnet18_convs[i];
        macs += (double)c->out_h * c->out_h * c->cout * c->k * c->k * c->cin;
    }
    return macs + (double)RESNET18_FEATURES * classes;
}

int resnet18_tensor_id(int x)
{
    return x >= 0 ? x : x == R18_IMAGE ? R18_T_IMAGE : R18_T_POOL;
}

int resnet18_plan_tensors(resnet18_tensors *t, int cout_multiple, char *err, size_t errlen)
{
    const resnet18_conv_desc *c0 = &resnet18_convs[0];
    t->h[R18_T_IMAGE] = RESNET18_IMG;
    t->c[R18_T_IMAGE] = 3;
    t->h[R18_T_POOL] = (c0->out_h + 2 - 3) / 2 + 1;
    t->c[R18_T_POOL] = c0->cout;
    for (int i = 0; i < R18_NTENSORS; i++)
        t->last_use[i] = -1;
    t->born[R18_T_IMAGE] = 0;
    t->born[R18_T_POOL] = 2;
    t->last_use[0] = 2;
    for (int i = 0; i < RESNET18_NUM_CONVS; i++) {
        const resnet18_conv_desc *d = &resnet18_convs[i];
        const int now = i == 0 ? 1 : i + 2;
        if (d->src >= i || d->residual >= i || (i == 0) != (d->src == R18_IMAGE)) {
            snprintf(err, errlen, "conv %s reads a tensor not yet computed", d->name);
            return -1;
        }
        int s = resnet18_tensor_id(d->src);
        if (t->h[s] != d->in_h || t->c[s] != d->cin || d->cout % cout_multiple != 0 ||
            d->out_h != (d->in_h + 2 * d->pad - d->k) / d->stride + 1) {
            snprintf(err, errlen, "conv %s: shape does not chain", d->name);
            return -1;
        }
        t->h[i] = d->out_h;
        t->c[i] = d->cout;
        t->born[i] = now;
        if (now > t->last_use[s])
            t->last_use[s] = now;
        if (d->residual != R18_NONE) {
            int r = resnet18_tensor_id(d->residual);
            if (t->h[r] != d->out_h || t->c[r] != d->cout) {
                snprintf(err, errlen, "conv %s: residual shape mismatch", d->name);
                return -1;
            }
            if (now > t->last_use[r])
                t->last_use[r] = now;
        }
    }
    if (t->c[RESNET18_NUM_CONVS - 1] != RESNET18_FEATURES) {
        snprintf(err, errlen, "last conv does not give %d features", RESNET18_FEATURES);
        return -1;
    }
    return 0;
}

int resnet18_share_buffers(const resnet18_tensors *t, const int *order, int n, const size_t *elems, int *buf,
                           size_t *per_image)
{
    int holder[R18_NTENSORS], nbuf = 0;
    for (int j = 0; j < n; j++) {
        int x = order[j], b = -1;
        for (int k = 0; k < nbuf && b < 0; k++)
            if (t->last_use[holder[k]] < t->born[x])
                b = k;
        if (b < 0) {
            b = nbuf++;
            per_image[b] = 0;
        }
        holder[b] = x;
        buf[x] = b;
        if (elems[x] > per_image[b])
            per_image[b] = elems[x];
    }
    return nbuf;
}
