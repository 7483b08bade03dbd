/* The memory budget: a compare-and-swap on one counter, so concurrent
 * acquires can never overshoot the cap between them. */
#include "daemon/http/budget.h"

void budget_init(budget *b, size_t cap)
{
    atomic_init(&b->used, 0);
    b->cap = cap;
}

int budget_try_acquire(budget *b, size_t n)
{
    size_t used = atomic_load_explicit(&b->used, memory_order_relaxed);
    do {
        if (n > b->cap || used > b->cap - n)
            return -1;
    } while (
        !atomic_compare_exchange_weak_explicit(&b->used, &used, used + n, memory_order_relaxed, memory_order_relaxed));
    return 0;
}

void budget_release(budget *b, size_t n)
{
    atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
}

size_t budget_used(const budget *b)
{
    return atomic_load_explicit(&b->used, memory_order_relaxed);
}

size_t budget_cap(const budget *b)
{
    return b->cap;
}
