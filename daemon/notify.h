/* systemd's sd_notify protocol without libsystemd: datagrams such as
 * "READY=1" to the AF_UNIX socket named by $NOTIFY_SOCKET ('@' = abstract
 * namespace). Without $NOTIFY_SOCKET every call is a no-op. */
#ifndef RESNETD_NOTIFY_H
#define RESNETD_NOTIFY_H

#include <stdint.h>

/* Sends one state string; 0 on success or when not under systemd. */
int notify_send(const char *state);

/* The watchdog interval systemd asked for ($WATCHDOG_USEC, when
 * $WATCHDOG_PID is unset or ours), or 0 when none. */
uint64_t notify_watchdog_usec(void);

#endif
