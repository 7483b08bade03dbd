/* One-line log messages on stderr ("resnetd: warning: ..."), which systemd
 * sends to the journal. Safe from any thread: each message is one write. */
#ifndef RESNETD_LOG_H
#define RESNETD_LOG_H

#if defined(__GNUC__)
#define LOG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LOG_PRINTF(a, b)
#endif

void log_info(const char *fmt, ...) LOG_PRINTF(1, 2);
void log_warn(const char *fmt, ...) LOG_PRINTF(1, 2);
void log_error(const char *fmt, ...) LOG_PRINTF(1, 2);

#endif
