/* A global memory budget: a thread-safe byte counter with a cap.
 *
 * Request bodies are buffered in memory; without a global bound, many
 * connections each announcing a large body reach gigabytes between them.
 * Every byte of buffer a request holds is charged here first, and a charge
 * that would pass the cap is refused (the server answers 503 with
 * Retry-After). Whoever acquired bytes releases exactly as many.
 *
 * Lock-free: one atomic counter, a compare-and-swap loop per acquire. */
#ifndef RESNETD_BUDGET_H
#define RESNETD_BUDGET_H

#include <stdatomic.h>
#include <stddef.h>

typedef struct budget {
    atomic_size_t used; /* bytes currently acquired */
    size_t cap; /* used never exceeds this */
} budget;

void budget_init(budget *b, size_t cap);

/* Acquires n bytes: 0, or -1 (nothing acquired) when used + n would pass
 * the cap. Acquiring 0 bytes always succeeds. */
int budget_try_acquire(budget *b, size_t n);

/* Gives back n bytes acquired earlier. */
void budget_release(budget *b, size_t n);

size_t budget_used(const budget *b);
size_t budget_cap(const budget *b);

#endif
