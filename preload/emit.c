/*
 * emit.c - the preload's messages: built on the stack (geco_log.h), written with one
 * write() or sendto(), to the destination the config's log= line names.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "preload.h"

/* severity: 3 error, 4 warning */
void emit(int severity, const char *text, size_t len)
{
    char buf[1100];
    line_t l = {buf, sizeof buf, 0};
    ssize_t n;

    if (cfg.log_to == LOG_NONE)
        return;
    if (cfg.log_to == LOG_SYSLOG) {
        /* a datagram to /dev/log (journald or rsyslog) by hand: syslog(3)
           takes a lock, which a child of a multithreaded parent must not */
        /* /dev/log, or journald's own socket on a host without the symlink */
        static const char *const paths[] = {"/dev/log", "/run/systemd/journal/dev-log"};
        put(&l, "<");
        put_u64(&l, (uint64_t)(3 * 8 + severity)); /* facility daemon */
        put(&l, ">geco-preload[");
        put_u64(&l, (uint64_t)getpid());
        put(&l, "]: ");
        for (size_t i = 0; i < len && l.len + 2 < l.cap; i++)
            l.buf[l.len++] = text[i];
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return;
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
            struct sockaddr_un to = {.sun_family = AF_UNIX};
            memcpy(to.sun_path, paths[i], strlen(paths[i]) + 1);
            n = sendto(fd, l.buf, l.len, MSG_NOSIGNAL, (struct sockaddr *)&to, sizeof to);
            if (n >= 0 || (errno != ENOENT && errno != ECONNREFUSED))
                break;
        }
        close(fd);
        return;
    }
    put(&l, "geco: ");
    for (size_t i = 0; i < len && l.len + 2 < l.cap; i++)
        l.buf[l.len++] = text[i];
    l.buf[l.len++] = '\n';
    do
        n = write(STDERR_FILENO, l.buf, l.len);
    while (n < 0 && errno == EINTR);
}

void put_job(line_t *l, const char *name, uint64_t job, uint64_t task, uint32_t pid)
{
    put(l, name);
    put(l, " (pid ");
    put_u64(l, pid);
    if (job != 0) {
        put(l, ", job ");
        put_u64(l, job);
        put(l, ".");
        put_u64(l, task);
    }
    put(l, ")");
}
