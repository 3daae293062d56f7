/*
 * geco_mntns.c - enter a job's mount namespace (see geco_mntns.h).
 */
#define _GNU_SOURCE

#include "geco_mntns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* geco_join_mntns() as root: sge_execd forks its shepherds with the admin user's
   effective uid (its real and saved uid root), which may neither open the pin (root's,
   0600) nor setns (CAP_SYS_ADMIN, back in the effective set with euid 0). */
static int join(const char *path, const char **step);

int geco_join_mntns(const char *dir, uint64_t job, uint64_t task, char *path, size_t pathlen,
                    const char **step)
{
    uid_t euid = geteuid();
    struct stat st;
    int rc, err;

    *step = "open";
    if (dir[0] == '\0')
        return 0;
    if (snprintf(path, pathlen, "%s/%llu.%llu", dir, (unsigned long long)job,
                 (unsigned long long)task) >= (int)pathlen) {
        errno = ENAMETOOLONG;
        return -1;
    }
    /* none pinned (the node's default, [tmp] private off: no pins directory): nothing to
       do, and no privilege taken back for it (the directory is 0711, so any uid sees) */
    if (stat(path, &st) != 0 && errno == ENOENT)
        return 0;
    if (euid != 0 && seteuid(0) != 0) {
        *step = "seteuid";
        return -1;
    }
    rc = join(path, step);
    err = errno;
    if (euid != 0 && seteuid(euid) != 0) {
        *step = "seteuid back";
        return -1;
    }
    errno = err;
    return rc;
}

static int join(const char *path, const char **step)
{
    int fd, cwd, err;

    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    /* the working directory held, not its path: in the namespace the same path may
       lead into the job owner's private /tmp (execd's spool under /tmp), a tree root
       must not enter */
    *step = "open cwd";
    cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd >= 0) {
        *step = "setns";
        if (setns(fd, CLONE_NEWNS) == 0) {
            *step = "fchdir";
            if (fchdir(cwd) == 0) {
                close(cwd);
                close(fd);
                return 1;
            }
        }
        err = errno;
        close(cwd);
        errno = err;
    }
    err = errno;
    close(fd);
    errno = err;
    return -1;
}
