/* stderr logging with a syslog priority prefix that journald understands
 * (<6> info, <4> warning, <3> error) when stderr is the journal, plain
 * "resnetd: level:" otherwise. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "daemon/log.h"
#include "util/utf8.h"

static void log_line(int prio, const char *level, const char *fmt, va_list ap)
{
    char raw[1024], clean[1024], msg[1024];
    vsnprintf(raw, sizeof raw, fmt, ap);
    /* Lines quote paths, config text and client bytes: bytes that are not
     * UTF-8, and control characters (a newline would forge a line), are
     * written as \xNN, not passed to the terminal or journal. */
    utf8_sanitize(clean, sizeof clean, raw);
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)clean; *p && o + 5 < sizeof msg; p++) {
        if (*p < 0x20 || *p == 0x7f)
            o += (size_t)snprintf(msg + o, sizeof msg - o, "\\x%02X", *p);
        else
            msg[o++] = (char)*p;
    }
    msg[o] = '\0';
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
