/* The access log: one JSON line per request (time, peer, method, path,
 * status, bytes in and out, images, latency, request id), appended to a
 * file by a thread of its own. Requests never wait for the disk: a line
 * goes into a fixed 1 MiB buffer, which the writer empties; when the disk
 * falls that far behind, lines are dropped and the next line written says
 * how many ({"dropped": N}). The file is opened O_APPEND, so logrotate's
 * copytruncate works. */
#ifndef RESNETD_ACCESSLOG_H
#define RESNETD_ACCESSLOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct accesslog accesslog;

typedef struct accesslog_entry {
    const char *peer; /* "ADDR:PORT" */
    const char *method, *path;
    int status;
    uint64_t bytes_in, bytes_out;
    int images;
    double latency_ms;
    const char *id; /* the client's X-Request-Id, or the daemon's own */
} accesslog_entry;

/* Opens (creating, mode 0640) path for appending and starts the writer;
 * NULL with err on failure. */
accesslog *accesslog_open(const char *path, char *err, size_t errlen);

/* Queues one line; any thread; never blocks on I/O. */
void accesslog_write(accesslog *a, const accesslog_entry *e);

/* Writes what is queued, stops the writer and closes the file. */
void accesslog_close(accesslog *a);

#endif
