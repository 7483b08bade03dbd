/* The slow-client decision (slowloris), a pure function the HTTP layer
 * (daemon/http/http.c) applies to each of its connections a few times a second.
 *
 * An idle timeout alone is not enough: each byte would reset it, so a
 * client sending one byte every few seconds would hold its slot forever.
 * A request must meet two bounds instead:
 *   - its headers arrive complete within header_timeout of the connection
 *     opening (or of the previous answer on a kept-alive connection);
 *   - its body then arrives at an average of at least min_rate bytes/s,
 *     measured from the end of the headers, once header_timeout has passed.
 * While the server holds the request (decoding, queued, answering) the
 * client is not timed. */
#ifndef RESNETD_CONN_H
#define RESNETD_CONN_H

#include <stdint.h>

typedef enum {
    CONN_HEADERS, /* waiting for a request's headers */
    CONN_BODY, /* reading a request body */
    CONN_SERVER, /* the server's turn: processing or answering */
} conn_phase;

typedef enum {
    CONN_OK,
    CONN_SLOW_HEADERS, /* headers not complete within header_timeout */
    CONN_SLOW_BODY, /* body below min_rate */
} conn_verdict;

typedef struct conn_limits {
    uint64_t header_timeout_us;
    uint64_t min_rate; /* body bytes per second; 0: no minimum */
} conn_limits;

/* A connection in phase since since_us that has received body_bytes in
 * that phase, judged at now_us. */
conn_verdict conn_judge(const conn_limits *l, conn_phase phase, uint64_t since_us, uint64_t body_bytes,
                        uint64_t now_us);

#endif
