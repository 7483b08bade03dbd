/* A blocking HTTP/1.1 GET with a time limit, for the few requests
 * resnetd-load makes outside the load: the reachability probe and the
 * /metrics scrapes before and after the run. */
#ifndef RESNETD_HTTP_GET_H
#define RESNETD_HTTP_GET_H

#include <stddef.h>
#include <sys/socket.h>

/* 0 with *status and the body (malloc'd, NUL-terminated; the caller frees
 * it) on any HTTP answer; -1 with a one-line reason in err when the server
 * cannot be reached or does not answer within timeout_ms. */
int http_get(const struct sockaddr *addr, socklen_t addrlen, const char *host, const char *path, int timeout_ms,
             int *status, char **body, size_t *body_len, char *err, size_t errlen);

#endif
