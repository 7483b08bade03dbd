/* The ResNet18 topology table: 20 convolutions in execution order. */
#include "model/resnet18.h"

/* Block structure (BasicBlock): out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
 * In each layer's first block of layers 2..4 the shortcut is a 1x1/2 conv
 * (downsample), which runs before conv2 so conv2 can add it in its epilogue. */
const resnet18_conv_desc resnet18_convs[RESNET18_NUM_CONVS] = {
    /* name               bn                  cin  cout k s p  in  out src res relu */
    {"conv1",             "bn1",                3,  64, 7, 2, 3, 224, 112, R18_IMAGE, R18_NONE, 1},
    {"layer1.0.conv1",    "layer1.0.bn1",      64,  64, 3, 1, 1,  56,  56, R18_POOL, R18_NONE, 1},
    {"layer1.0.conv2",    "layer1.0.bn2",      64,  64, 3, 1, 1,  56,  56,  1, R18_POOL, 1},
    {"layer1.1.conv1",    "layer1.1.bn1",      64,  64, 3, 1, 1,  56,  56,  2, R18_NONE, 1},
    {"layer1.1.conv2",    "layer1.1.bn2",      64,  64, 3, 1, 1,  56,  56,  3, 2, 1},
    {"layer2.0.conv1",    "layer2.0.bn1",      64, 128, 3, 2, 1,  56,  28,  4, R18_NONE, 1},
    {"layer2.0.downsample.0", "layer2.0.downsample.1", 64, 128, 1, 2, 0, 56, 28, 4, R18_NONE, 0},
    {"layer2.0.conv2",    "layer2.0.bn2",     128, 128, 3, 1, 1,  28,  28,  5, 6, 1},
    {"layer2.1.conv1",    "layer2.1.bn1",     128, 128, 3, 1, 1,  28,  28,  7, R18_NONE, 1},
    {"layer2.1.conv2",    "layer2.1.bn2",     128, 128, 3, 1, 1,  28,  28,  8, 7, 1},
    {"layer3.0.conv1",    "layer3.0.bn1",     128, 256, 3, 2, 1,  28,  14,  9, R18_NONE, 1},
    {"layer3.0.downsample.0", "layer3.0.downsample.1", 128, 256, 1, 2, 0, 28, 14, 9, R18_NONE, 0},
    {"layer3.0.conv2",    "layer3.0.bn2",     256, 256, 3, 1, 1,  14,  14, 10, 11, 1},
    {"layer3.1.conv1",    "layer3.1.bn1",     256, 256, 3, 1, 1,  14,  14, 12, R18_NONE, 1},
    {"layer3.1.conv2",    "layer3.1.bn2",     256, 256, 3, 1, 1,  14,  14, 13, 12, 1},
    {"layer4.0.conv1",    "layer4.0.bn1",     256, 512, 3, 2, 1,  14,   7, 14, R18_NONE, 1},
    {"layer4.0.downsample.0", "layer4.0.downsample.1", 256, 512, 1, 2, 0, 14, 7, 14, R18_NONE, 0},
    {"layer4.0.conv2",    "layer4.0.bn2",     512, 512, 3, 1, 1,   7,   7, 15, 16, 1},
    {"layer4.1.conv1",    "layer4.1.bn1",     512, 512, 3, 1, 1,   7,   7, 17, R18_NONE, 1},
    {"layer4.1.conv2",    "layer4.1.bn2",     512, 512, 3, 1, 1,   7,   7, 18, 17, 1},
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
