/* sd_notify(3) reimplemented: one sendto() of a datagram per state. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/notify.h"

int notify_send(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
        log_warn("NOTIFY_SOCKET '%s' is not a socket path; not notifying systemd", path);
        return -1;
    }
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract namespace: no terminating NUL counted */
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        log_warn("notify socket: %s", strerror(errno));
        return -1;
    }
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    int saved = errno;
    close(fd);
    if (n < 0) {
        log_warn("notify %s: %s", state, strerror(saved));
        return -1;
    }
    return 0;
}

uint64_t notify_watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC");
    if (!usec)
        return 0;
    const char *pid = getenv("WATCHDOG_PID");
    if (pid && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(usec, &end, 10);
    if (errno || *end || v == 0)
        return 0;
    return (uint64_t)v;
}
