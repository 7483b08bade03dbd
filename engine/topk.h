/* Softmax and top-k over one image's logits. */
#ifndef RESNETD_TOPK_H
#define RESNETD_TOPK_H

typedef struct topk_entry {
    int index;
    float score; /* softmax probability */
} topk_entry;

/* Writes the k highest-scoring classes of logits[n], best first (ties: lower
 * index first). k is clamped to n. Returns the number written. */
int topk_softmax(const float *logits, int n, int k, topk_entry *out);

/* The softmax of all n logits, each exactly the score topk_softmax gives
 * that class. */
void topk_softmax_all(const float *logits, int n, float *probs);

#endif
