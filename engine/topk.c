/* Softmax and top-k over one image's logits, in double for stable sums. */
#include <math.h>
#include "engine/topk.h"

/* The maximum and the sum of exp(logit - max): one definition for both
 * functions, so their scores agree bit for bit. */
static double softmax_sum(const float *logits, int n, float *mx)
{
    *mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > *mx)
            *mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - *mx);
    return sum;
}

void topk_softmax_all(const float *logits, int n, float *probs)
{
    if (n <= 0)
        return;
    float mx;
    double sum = softmax_sum(logits, n, &mx);
    for (int i = 0; i < n; i++)
        probs[i] = (float)(exp((double)logits[i] - mx) / sum);
}

int topk_softmax(const float *logits, int n, int k, topk_entry *out)
{
    if (k > n)
        k = n;
    if (k <= 0 || n <= 0)
        return 0;
    float mx;
    double sum = softmax_sum(logits, n, &mx);
    /* Insertion into a sorted list of k: k is small (<= n, usually 5). */
    int have = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (have == k && v <= logits[out[k - 1].index])
            continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && logits[out[j - 1].index] < v) {
            out[j] = out[j - 1];
            j--;
        }
        out[j].index = i;
    }
    for (int i = 0; i < k; i++)
        out[i].score = (float)(exp((double)logits[out[i].index] - mx) / sum);
    return k;
}
