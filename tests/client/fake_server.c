/* A stand-in for resnetd that the resnetd-load tests (and the libcurl-vs-epoll
 * measurement) drive on loopback. POST /classify answers 200 with a small
 * JSON body; on request every Nth classify gets 503 with Retry-After, every
 * Mth is dropped by closing the connection without an answer, and with
 * --stall-ms the classify answers go out one at a time, each STALL ms after
 * the previous (a server with a fixed capacity that backs up). GET /metrics
 * serves resnetd-like counters with chunked encoding, so the client's chunked
 * path is exercised too.
 *
 * Single thread, level-triggered epoll. Prints its port on stdout (or into
 * --port-file); on SIGTERM or SIGINT prints what it did as key=value lines
 * on stdout and exits 0, so a test can compare the client's counts with the
 * server's. Counters are per process, starting at 1 for the first classify. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MAX_REQUEST (64u << 20)

typedef struct {
    int open;
    uint64_t gen; /* bumps on every accept, so a stale stalled answer is dropped */
    char *in; /* request bytes not yet handled */
    size_t in_len, in_cap;
    char *out; /* answer bytes not yet written */
    size_t out_len, out_off, out_cap;
} conn;

/* A stalled answer waiting for its time: FIFO, times never decrease. */
typedef struct {
    int fd;
    uint64_t gen;
    uint64_t due_ns;
    int status;
} pending;

static struct {
    long fail_every, close_every, stall_ms, batch_size;
    conn conns[MAX_FDS];
    pending *fifo;
    size_t fifo_head, fifo_len, fifo_cap;
    uint64_t last_due_ns;
    int epfd;
    /* what happened, printed at exit */
    unsigned long requests, ok, status_503, closed, images, metrics_gets, accepted;
    /* what /metrics reports */
    unsigned long batch_count, batch_sum, queue_count;
    double queue_sum;
} S;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "fake_server: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void conn_close(int fd)
{
    conn *c = &S.conns[fd];
    epoll_ctl(S.epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(c->in);
    free(c->out);
    uint64_t gen = c->gen;
    memset(c, 0, sizeof *c);
    c->gen = gen;
}

static int conn_flush(int fd)
{
    conn *c = &S.conns[fd];
    while (c->out_off < c->out_len) {
        ssize_t n = write(fd, c->out + c->out_off, c->out_len - c->out_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.fd = fd };
            return epoll_ctl(S.epfd, EPOLL_CTL_MOD, fd, &ev);
        }
        if (n < 0)
            return -1;
        c->out_off += (size_t)n;
    }
    c->out_len = c->out_off = 0;
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
    return epoll_ctl(S.epfd, EPOLL_CTL_MOD, fd, &ev);
}

static int conn_append(int fd, const char *data, size_t len)
{
    conn *c = &S.conns[fd];
    if (c->out_len + len > c->out_cap) {
        size_t cap = (c->out_len + len) * 2;
        char *p = realloc(c->out, cap);
        if (!p)
            return -1;
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    return 0;
}

static int send_simple(int fd, int status, const char *reason, const char *extra, const char *body)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n%s", status,
                     reason, extra, strlen(body), body);
    if (n < 0 || (size_t)n >= sizeof buf || conn_append(fd, buf, (size_t)n) != 0)
        return -1;
    return conn_flush(fd);
}

static int send_classify_answer(int fd, int status)
{
    if (status == 503)
        return send_simple(fd, 503, "Service Unavailable", "Retry-After: 1\r\n",
                           "{\"error\":{\"status\":503,\"code\":\"queue_full\",\"message\":\"queue is full\"}}");
    return send_simple(fd, 200, "OK", "",
                       "{\"model\":\"resnet18\",\"device\":\"fake\",\"results\":[{\"predictions\":"
                       "[{\"index\":281,\"label\":\"tabby\",\"score\":0.87}]}]}");
}

/* /metrics in chunked encoding: one chunk per line. */
static int send_metrics(int fd)
{
    char body[2048];
    int n = snprintf(body, sizeof body,
                     "# HELP resnetd_batch_size Images per batch.\n"
                     "# TYPE resnetd_batch_size histogram\n"
                     "resnetd_batch_size_bucket{le=\"+Inf\"} %lu\n"
                     "resnetd_batch_size_sum %lu\n"
                     "resnetd_batch_size_count %lu\n"
                     "# TYPE resnetd_queue_duration_seconds histogram\n"
                     "resnetd_queue_duration_seconds_bucket{le=\"+Inf\"} %lu\n"
                     "resnetd_queue_duration_seconds_sum %.9f\n"
                     "resnetd_queue_duration_seconds_count %lu\n"
                     "# TYPE resnetd_rejected_total counter\n"
                     "resnetd_rejected_total{reason=\"queue_full\"} %lu\n"
                     "resnetd_rejected_total{reason=\"timeout\"} 0\n"
                     "resnetd_images_total %lu\n",
                     S.batch_count, S.batch_sum, S.batch_count, S.queue_count, S.queue_sum, S.queue_count, S.status_503,
                     S.images);
    if (n < 0 || (size_t)n >= sizeof body)
        return -1;
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    if (conn_append(fd, head, strlen(head)) != 0)
        return -1;
    const char *p = body;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = (size_t)(nl - p) + 1;
        char size_line[32];
        int m = snprintf(size_line, sizeof size_line, "%zx\r\n", len);
        if (conn_append(fd, size_line, (size_t)m) != 0 || conn_append(fd, p, len) != 0 ||
            conn_append(fd, "\r\n", 2) != 0)
            return -1;
        p += len;
    }
    if (conn_append(fd, "0\r\n\r\n", 5) != 0)
        return -1;
    return conn_flush(fd);
}

static int classify(int fd, const char *body, size_t body_len, int multipart)
{
    unsigned long images = 1;
    if (multipart) {
        images = 0;
        static const char needle[] = "name=\"image\"";
        for (size_t i = 0; i + sizeof needle - 1 <= body_len; i++)
            if (memcmp(body + i, needle, sizeof needle - 1) == 0)
                images++;
    }
    S.requests++;
    if (S.close_every > 0 && S.requests % (unsigned long)S.close_every == 0) {
        S.closed++;
        conn_close(fd);
        return 1;
    }
    int status = 200;
    if (S.fail_every > 0 && S.requests % (unsigned long)S.fail_every == 0) {
        status = 503;
        S.status_503++;
    } else {
        S.ok++;
        S.images += images;
        S.batch_count++;
        S.batch_sum += (unsigned long)S.batch_size;
        S.queue_count += images;
        S.queue_sum += 0.002 * (double)images;
    }
    if (S.stall_ms <= 0)
        return send_classify_answer(fd, status);
    if (S.fifo_len == S.fifo_cap) {
        size_t cap = S.fifo_cap ? 2 * S.fifo_cap : 256;
        pending *p = malloc(cap * sizeof *p);
        if (!p)
            return -1;
        for (size_t i = 0; i < S.fifo_len; i++)
            p[i] = S.fifo[(S.fifo_head + i) % S.fifo_cap];
        free(S.fifo);
        S.fifo = p;
        S.fifo_cap = cap;
        S.fifo_head = 0;
    }
    uint64_t now = now_ns();
    uint64_t start = S.last_due_ns > now ? S.last_due_ns : now;
    S.last_due_ns = start + (uint64_t)S.stall_ms * 1000000u;
    S.fifo[(S.fifo_head + S.fifo_len) % S.fifo_cap] = (pending){
        .fd = fd, .gen = S.conns[fd].gen, .due_ns = S.last_due_ns, .status = status
    };
    S.fifo_len++;
    return 0;
}

/* Handles every complete request in the buffer. Returns -1 to close, 1 if
 * the connection was closed deliberately. */
static int conn_handle(int fd)
{
    conn *c = &S.conns[fd];
    for (;;) {
        char *end = c->in_len >= 4 ? memmem(c->in, c->in_len, "\r\n\r\n", 4) : NULL;
        if (!end)
            return c->in_len > 65536 ? -1 : 0;
        size_t head_len = (size_t)(end - c->in) + 4;
        size_t body_len = 0;
        int multipart = 0;
        for (char *line = strstr(c->in, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
            if (strncasecmp(line + 2, "Content-Length:", 15) == 0)
                body_len = strtoul(line + 17, NULL, 10);
            else if (strncasecmp(line + 2, "Content-Type: multipart/", 24) == 0)
                multipart = 1;
        }
        if (body_len > MAX_REQUEST)
            return -1;
        if (c->in_len < head_len + body_len)
            return 0;
        int r;
        if (strncmp(c->in, "POST /classify", 14) == 0) {
            r = classify(fd, c->in + head_len, body_len, multipart);
            if (r != 0)
                return r;
        } else if (strncmp(c->in, "GET /metrics ", 13) == 0) {
            S.metrics_gets++;
            if (send_metrics(fd) != 0)
                return -1;
        } else if (send_simple(fd, 404, "Not Found", "",
                               "{\"error\":{\"status\":404,\"code\":\"not_found\",\"message\":\"no such path\"}}") !=
                   0) {
            return -1;
        }
        memmove(c->in, c->in + head_len + body_len, c->in_len - head_len - body_len);
        c->in_len -= head_len + body_len;
        c->in[c->in_len] = '\0';
    }
}

static int conn_read(int fd)
{
    conn *c = &S.conns[fd];
    for (;;) {
        if (c->in_cap - c->in_len < 65536 + 1) {
            size_t cap = c->in_cap ? 2 * c->in_cap : 131072;
            if (cap > MAX_REQUEST + 65536)
                return -1;
            char *p = realloc(c->in, cap);
            if (!p)
                return -1;
            c->in = p;
            c->in_cap = cap;
        }
        ssize_t n = read(fd, c->in + c->in_len, c->in_cap - c->in_len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0)
            return -1;
        c->in_len += (size_t)n;
        c->in[c->in_len] = '\0';
        if ((size_t)n < 65536)
            break;
    }
    return conn_handle(fd);
}

static void fire_due(void)
{
    uint64_t now = now_ns();
    while (S.fifo_len > 0) {
        pending *p = &S.fifo[S.fifo_head];
        if (p->due_ns > now)
            break;
        conn *c = &S.conns[p->fd];
        if (c->open && c->gen == p->gen && send_classify_answer(p->fd, p->status) != 0)
            conn_close(p->fd);
        S.fifo_head = (S.fifo_head + 1) % S.fifo_cap;
        S.fifo_len--;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: fake_server [--port N] [--port-file FILE] [--503-every N] [--close-every N]\n"
                    "                   [--stall-ms MS] [--batch-size B]\n");
    exit(2);
}

static long parse_long(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = { { "port", required_argument, NULL, 'p' },
                                          { "port-file", required_argument, NULL, 'f' },
                                          { "503-every", required_argument, NULL, '5' },
                                          { "close-every", required_argument, NULL, 'x' },
                                          { "stall-ms", required_argument, NULL, 's' },
                                          { "batch-size", required_argument, NULL, 'b' },
                                          { NULL, 0, NULL, 0 } };
    long port = 0;
    const char *port_file = NULL;
    S.batch_size = 1;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'p': port = parse_long(optarg); break;
        case 'f': port_file = optarg; break;
        case '5': S.fail_every = parse_long(optarg); break;
        case 'x': S.close_every = parse_long(optarg); break;
        case 's': S.stall_ms = parse_long(optarg); break;
        case 'b': S.batch_size = parse_long(optarg); break;
        default: usage();
        }
    }
    if (optind != argc || port > 65535)
        usage();

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    int one = 1;
    if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        die("setsockopt");
    struct sockaddr_in addr = { .sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof addr;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, 4096) != 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0)
        die("bind/listen");

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    if (sigprocmask(SIG_BLOCK, &sigs, NULL) != 0)
        die("sigprocmask");
    int sfd = signalfd(-1, &sigs, SFD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN);
    S.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (sfd < 0 || S.epfd < 0)
        die("signalfd/epoll");
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = lfd };
    if (epoll_ctl(S.epfd, EPOLL_CTL_ADD, lfd, &ev) != 0)
        die("epoll_ctl");
    ev.data.fd = sfd;
    if (epoll_ctl(S.epfd, EPOLL_CTL_ADD, sfd, &ev) != 0)
        die("epoll_ctl");

    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%u\n", ntohs(addr.sin_port)) < 0 || fclose(f) != 0)
            die(port_file);
    } else {
        printf("%u\n", ntohs(addr.sin_port));
        fflush(stdout);
    }

    for (;;) {
        int timeout = -1;
        if (S.fifo_len > 0) {
            uint64_t now = now_ns(), due = S.fifo[S.fifo_head].due_ns;
            timeout = due <= now ? 0 : (int)((due - now + 999999) / 1000000);
        }
        struct epoll_event evs[256];
        int n = epoll_wait(S.epfd, evs, 256, timeout);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == sfd) {
                printf("requests=%lu\nok=%lu\nstatus_503=%lu\nclosed=%lu\nimages=%lu\nmetrics_gets=%lu\n"
                       "accepted=%lu\n",
                       S.requests, S.ok, S.status_503, S.closed, S.images, S.metrics_gets, S.accepted);
                return fflush(stdout) == 0 ? 0 : 1;
            }
            if (fd == lfd) {
                int cfd;
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event cev = { .events = EPOLLIN, .data.fd = cfd };
                    if (cfd >= MAX_FDS || epoll_ctl(S.epfd, EPOLL_CTL_ADD, cfd, &cev) != 0) {
                        close(cfd);
                        continue;
                    }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    S.conns[cfd].open = 1;
                    S.conns[cfd].gen++;
                    S.accepted++;
                }
                continue;
            }
            if (!S.conns[fd].open)
                continue;
            int r = 0;
            if (evs[i].events & EPOLLOUT)
                r = conn_flush(fd);
            if (r == 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                r = conn_read(fd);
            if (r < 0 && S.conns[fd].open)
                conn_close(fd);
        }
        fire_due();
    }
}
