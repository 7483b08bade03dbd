/* Blocking GET over a non-blocking socket and poll(), so that every step
 * (connect, send, each read) is bounded by one overall deadline. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "client/http_get.h"
#include "client/http_response.h"
#include "util/clock.h"

/* Waits for events on fd until deadline; 0, or -1 with err set. */
static int wait_fd(int fd, short events, uint64_t deadline_ns, char *err, size_t errlen)
{
    for (;;) {
        uint64_t now = clock_now_ns();
        if (now >= deadline_ns) {
            snprintf(err, errlen, "timed out");
            return -1;
        }
        struct pollfd p = { .fd = fd, .events = events };
        int n = poll(&p, 1, (int)((deadline_ns - now + 999999) / 1000000));
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

int http_get(const struct sockaddr *addr, socklen_t addrlen, const char *host, const char *path, int timeout_ms,
             int *status, char **body, size_t *body_len, char *err, size_t errlen)
{
    uint64_t deadline = clock_now_ns() + (uint64_t)timeout_ms * 1000000u;
    http_response resp;
    http_response_init(&resp, 1);
    char req[2048];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host);
    if (rl < 0 || (size_t)rl >= sizeof req) {
        snprintf(err, errlen, "request too long");
        return -1;
    }
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, addr, addrlen) != 0) {
        int e = errno;
        if (e != EINPROGRESS) {
            snprintf(err, errlen, "connect: %s", strerror(e));
            goto fail;
        }
        if (wait_fd(fd, POLLOUT, deadline, err, errlen) != 0)
            goto fail;
        socklen_t len = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0 || e != 0) {
            snprintf(err, errlen, "connect: %s", strerror(e ? e : errno));
            goto fail;
        }
    }
    for (int off = 0; off < rl;) {
        ssize_t n = send(fd, req + off, (size_t)(rl - off), MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN) {
            if (wait_fd(fd, POLLOUT, deadline, err, errlen) != 0)
                goto fail;
            continue;
        }
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "send: %s", strerror(errno));
            goto fail;
        }
        if (n > 0)
            off += (int)n;
    }
    for (;;) {
        char buf[16384];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EAGAIN) {
            if (wait_fd(fd, POLLIN, deadline, err, errlen) != 0)
                goto fail;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "read: %s", strerror(errno));
            goto fail;
        }
        size_t used = 0;
        http_response_result r = n == 0 ? http_response_eof(&resp) : http_response_feed(&resp, buf, (size_t)n, &used);
        if (r == HTTP_RESPONSE_ERROR) {
            snprintf(err, errlen, "bad answer: %s", resp.error);
            goto fail;
        }
        if (r == HTTP_RESPONSE_DONE)
            break;
    }
    close(fd);
    *status = resp.status;
    if (!resp.body && !(resp.body = calloc(1, 1))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *body = resp.body;
    *body_len = resp.body_len;
    return 0;
fail:
    close(fd);
    http_response_free(&resp);
    return -1;
}
