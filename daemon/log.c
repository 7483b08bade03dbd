/* stderr logging with a syslog priority prefix that journald understands
 * (<6> info, <4> warning, <3> error) when stderr is the journal, plain
 * "resnetd: level:" otherwise. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "daemon/log.h"
#include "model/utf8.h"

static void log_line(int prio, const char *level, const char *fmt, va_list ap)
{
    char raw[1024], msg[1024];
    vsnprintf(raw, sizeof raw, fmt, ap);
    /* Lines quote paths, config text and client bytes: bytes that are not
     * UTF-8 are written as \xNN, not passed to the terminal or journal. */
    utf8_sanitize(msg, sizeof msg, raw);
    char line[1100];
    int n;
    if (getenv("JOURNAL_STREAM"))
        n = snprintf(line, sizeof line, "<%d>%s\n", prio, msg);
    else
        n = snprintf(line, sizeof line, "resnetd: %s%s\n", level, msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = (int)sizeof line - 1;
    /* One write(2) so lines from different threads do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void log_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_line(6, "", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_line(4, "warning: ", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_line(3, "error: ", fmt, ap);
    va_end(ap);
}
