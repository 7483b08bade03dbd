/* The slow-client decision (conn.h). */
#include "daemon/http/conn.h"

conn_verdict conn_judge(const conn_limits *l, conn_phase phase, uint64_t since_us, uint64_t body_bytes, uint64_t now_us)
{
    uint64_t elapsed = now_us > since_us ? now_us - since_us : 0;
    if (phase == CONN_HEADERS)
        return elapsed > l->header_timeout_us ? CONN_SLOW_HEADERS : CONN_OK;
    if (phase == CONN_BODY && l->min_rate > 0 && elapsed > l->header_timeout_us &&
        body_bytes < l->min_rate * (elapsed / 1000) / 1000)
        return CONN_SLOW_BODY;
    return CONN_OK;
}
