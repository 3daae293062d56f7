/*
 * geco-mntns -- a job's private /tmp and /dev/shm: its mount namespace made, pinned and
 * dropped (gecod runs it, as root, with paths it chose; geco/job/privatetmp.py).
 *
 *   geco-mntns [-n NODE_NS] make PIN TMPDIR SHM_BYTES [VARTMPDIR]
 *       a new mount namespace, a slave of this one (the node's mounts reach it, none of
 *       its own come back), with TMPDIR bound on /tmp (VARTMPDIR on /var/tmp) and a new
 *       tmpfs of SHM_BYTES on /dev/shm, all nosuid and nodev; kept alive by a bind
 *       mount of its nsfs file on PIN (a new file, in a directory made a private mount
 *       here, so the pin never propagates into the namespace it pins)
 *   geco-mntns [-n NODE_NS] drop PIN
 *       prints "shm_used BYTES" (what the namespace's /dev/shm holds), empties that
 *       /dev/shm (its pages freed even where a file of it is still open), then unmounts
 *       and removes PIN: the namespace goes with its last process
 *
 * Both first enter NODE_NS (a mount namespace's file, e.g. /proc/1/ns/mnt), the node's,
 * where sge_execd and sshd run and join the pins: gecod under systemd runs in a namespace
 * of its unit's (PrivateTmp=, ProtectSystem=), whose mounts the node never sees. One
 * that cannot be opened (an init this root may not look at: a container's) leaves this
 * process in its own; one that is this process's already is nothing to do.
 * A process joins with setns(open(PIN), CLONE_NEWNS) (the exec() preload, nsenter -m).
 * Exit 0 when done, 1 with one line on stderr naming what failed, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define NS_FLAGS (MS_NOSUID | MS_NODEV)

static int fail(const char *fmt, ...)
{
	va_list ap;
	char text[512];

	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	fprintf(stderr, "geco-mntns: %s\n", text);
	return 1;
}

/* The child's failure, sent whole through the pipe for the parent to print. */
static void child_fail(int out, const char *what, const char *path)
{
	char text[512];
	int n = snprintf(text, sizeof text, "%s %s: %s", what, path, strerror(errno));

	if (n > 0 && write(out, text, (size_t)n) < 0)
		_exit(3);
	_exit(1);
}

/* PIN's directory made a private mount of its own (bound on itself once). */
static int private_dir(const char *pin)
{
	char dir[PATH_MAX];
	char *slash;

	if (snprintf(dir, sizeof dir, "%s", pin) >= (int)sizeof dir)
		return fail("%s: path too long", pin);
	slash = strrchr(dir, '/');
	if (slash == NULL || slash == dir)
		return fail("%s: the pin must be in a directory of its own", pin);
	*slash = '\0';
	if (mount(NULL, dir, NULL, MS_PRIVATE, NULL) == 0)
		return 0;
	if (errno != EINVAL)
		return fail("cannot make %s private: %s", dir, strerror(errno));
	/* not a mount point yet */
	if (mount(dir, dir, NULL, MS_BIND, NULL) != 0)
		return fail("cannot bind %s on itself: %s", dir, strerror(errno));
	if (mount(NULL, dir, NULL, MS_PRIVATE, NULL) != 0)
		return fail("cannot make %s private: %s", dir, strerror(errno));
	return 0;
}

/* A source directory, opened before the binds: one on /tmp must not hide the next
 * source (a base under /tmp), and a link is never followed. */
static int open_dir(int out, const char *path)
{
	int fd = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		child_fail(out, "cannot open", path);
	return fd;
}

/* The directory open as src bound on dst, then made nosuid and nodev (a bind takes no
 * flags of its own). */
static void bind_private(int out, int src, const char *dst)
{
	char path[64];

	snprintf(path, sizeof path, "/proc/self/fd/%d", src);
	if (mount(path, dst, NULL, MS_BIND, NULL) != 0)
		child_fail(out, "cannot bind on", dst);
	if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | NS_FLAGS, NULL) != 0)
		child_fail(out, "cannot make nosuid,nodev", dst);
}

static void set_up(int out, const char *tmpdir, const char *shm_bytes, const char *vartmp)
{
	char options[64];
	int tmp, var;

	if (unshare(CLONE_NEWNS) != 0)
		child_fail(out, "cannot unshare the mount namespace for", tmpdir);
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
		child_fail(out, "cannot make the mounts slaves under", "/");
	/* in the new namespace (a bind takes only its own mounts), before any bind */
	tmp = open_dir(out, tmpdir);
	var = vartmp != NULL ? open_dir(out, vartmp) : -1;
	bind_private(out, tmp, "/tmp");
	if (var >= 0)
		bind_private(out, var, "/var/tmp");
	snprintf(options, sizeof options, "size=%s,mode=1777", shm_bytes);
	if (mount("geco-shm", "/dev/shm", "tmpfs", NS_FLAGS, options) != 0)
		child_fail(out, "cannot mount a tmpfs on", "/dev/shm");
}

/* The calling process onto the n-th CPU it may use (counting round its set). */
static void onto_cpu(unsigned n)
{
	cpu_set_t allowed, one;
	unsigned count, cpu;

	if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
		return;
	count = (unsigned)CPU_COUNT(&allowed);
	if (count == 0)
		return;
	n %= count;
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (CPU_ISSET(cpu, &allowed) && n-- == 0) {
			CPU_ZERO(&one);
			CPU_SET(cpu, &one);
			sched_setaffinity(0, sizeof one, &one);
			return;
		}
	}
}

/* One namespace made by a child (on the try-th CPU after the first try) and pinned on
 * PIN; -1 with *again set when the kernel refused the pin as a loop (EINVAL). */
static int make_once(const char *pin, const char *tmpdir, const char *shm_bytes,
		     const char *vartmp, unsigned try, int *again)
{
	int ready[2], go[2], status = 0;
	char text[512], nsfile[64];
	ssize_t n;
	pid_t child;

	*again = 0;
	if (pipe2(ready, O_CLOEXEC) != 0)
		return fail("pipe: %s", strerror(errno));
	if (pipe2(go, O_CLOEXEC) != 0) {
		close(ready[0]);
		close(ready[1]);
		return fail("pipe: %s", strerror(errno));
	}
	child = fork();
	if (child < 0) {
		status = fail("fork: %s", strerror(errno));
		close(go[0]);
		close(ready[1]);
		goto out;
	}
	if (child == 0) {
		char byte;

		close(ready[0]);
		close(go[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (try > 0)
			onto_cpu(try);
		set_up(ready[1], tmpdir, shm_bytes, vartmp);
		if (write(ready[1], "", 1) != 1)
			_exit(3);
		/* held until the parent has pinned the namespace (or gave up) */
		if (read(go[0], &byte, 1) < 0)
			_exit(3);
		_exit(0);
	}
	close(ready[1]);
	close(go[0]);
	n = read(ready[0], text, sizeof text - 1);
	if (n == 1 && text[0] == '\0') {
		snprintf(nsfile, sizeof nsfile, "/proc/%d/ns/mnt", (int)child);
		if (mount(nsfile, pin, NULL, MS_BIND, NULL) != 0) {
			*again = errno == EINVAL;
			status = *again ? -1 : fail("cannot pin the namespace on %s: %s", pin,
						    strerror(errno));
		}
	} else {
		text[n > 0 ? n : 0] = '\0';
		status = fail("%s", n > 0 ? text : "the namespace's maker died");
	}
	close(go[1]);
	go[1] = -1;
	waitpid(child, NULL, 0);
out:
	close(ready[0]);
	if (go[1] >= 0)
		close(go[1]);
	return status;
}

/* Linux 6.18 numbers namespaces from per-CPU batches, and refuses to pin a namespace
 * numbered below the pinning process's own (a loop, it takes it for): one made on
 * another CPU can be. Each try makes a new one on the next CPU. */
#define PIN_TRIES 32

static int make(const char *pin, const char *tmpdir, const char *shm_bytes,
		const char *vartmp)
{
	int fd, status = 0, again = 1;
	unsigned try;

	if (shm_bytes[0] == '\0' || strspn(shm_bytes, "0123456789") != strlen(shm_bytes))
		return fail("SHM_BYTES must be a whole number, got '%s'", shm_bytes);
	if (tmpdir[0] != '/' || (vartmp != NULL && vartmp[0] != '/'))
		return fail("the directories must be absolute paths");
	if (private_dir(pin) != 0)
		return 1;
	fd = open(pin, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return fail("cannot make the pin %s: %s", pin, strerror(errno));
	close(fd);
	for (try = 0; try < PIN_TRIES && again; try++)
		status = make_once(pin, tmpdir, shm_bytes, vartmp, try, &again);
	if (again)
		status = fail("cannot pin the namespace on %s: %s (%d tries)", pin,
			      strerror(EINVAL), PIN_TRIES);
	if (status != 0)
		unlink(pin);
	return status;
}

/* How much of a job's /dev/shm drop empties: directories deep, and entries in all (a
 * job that made more keeps the rest's pages until their last holder lets go). */
#define EMPTY_DEPTH 64
#define EMPTY_ENTRIES (1UL << 18)

/* Every regular file in the directory open as dir (closed here) truncated to nothing and
 * removed, every directory emptied and removed, everything else removed; by descriptor,
 * on the file system dev only, never following a link, *budget entries at most. A file
 * truncated frees its pages though another process (the owner's, from outside the job,
 * through /proc/PID/root) holds it open: unmounted, the tmpfs would keep them. */
static void empty_dir(int dir, dev_t dev, unsigned depth, unsigned long *budget)
{
	DIR *d = fdopendir(dir);
	struct dirent *e;
	struct stat st;
	int fd;

	if (d == NULL) {
		close(dir);
		return;
	}
	while (*budget > 0 && (e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		(*budget)--;
		if (fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != dev)
			continue;
		if (S_ISDIR(st.st_mode)) {
			fd = depth < EMPTY_DEPTH ? openat(dir, e->d_name, O_RDONLY | O_DIRECTORY |
							  O_NOFOLLOW | O_CLOEXEC) : -1;
			if (fd >= 0)
				empty_dir(fd, dev, depth + 1, budget);
			unlinkat(dir, e->d_name, AT_REMOVEDIR);
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			/* O_NONBLOCK: a FIFO put there since is not waited for, nor a lease */
			fd = openat(dir, e->d_name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY |
				    O_CLOEXEC);
			if (fd >= 0) {
				/* one that cannot be is removed all the same, as before */
				if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev ||
				    ftruncate(fd, 0) != 0)
					errno = 0;
				close(fd);
			}
		}
		unlinkat(dir, e->d_name, 0);
	}
	closedir(d);
}

/* The namespace's /dev/shm emptied, and what it held before in *used; only a tmpfs of its
 * own (never the node's, node_shm, should a pin name the node's namespace). */
static int empty_shm(dev_t node_shm, unsigned long long *used)
{
	unsigned long budget = EMPTY_ENTRIES;
	struct statvfs vfs;
	struct statfs fs;
	struct stat st;
	int fd = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstatvfs(fd, &vfs) != 0 || fstatfs(fd, &fs) != 0 || fstat(fd, &st) != 0) {
		close(fd);
		return -1;
	}
	/* what it held, before it is emptied */
	*used = (unsigned long long)(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize;
	if (fs.f_type == TMPFS_MAGIC && st.st_dev != node_shm)
		empty_dir(fd, st.st_dev, 0, &budget);
	else
		close(fd);
	return 0;
}

static int drop(const char *pin)
{
	int out[2], fd;
	unsigned long long used = 0;
	struct stat node_shm;
	pid_t child;

	if (stat("/dev/shm", &node_shm) != 0)
		node_shm.st_dev = 0;
	if (pipe2(out, O_CLOEXEC) != 0)
		return fail("pipe: %s", strerror(errno));
	child = fork();
	if (child < 0)
		return fail("fork: %s", strerror(errno));
	if (child == 0) {
		close(out[0]);
		fd = open(pin, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || setns(fd, CLONE_NEWNS) != 0 || empty_shm(node_shm.st_dev, &used) != 0)
			_exit(1);
		if (write(out[1], &used, sizeof used) != (ssize_t)sizeof used)
			_exit(1);
		_exit(0);
	}
	close(out[1]);
	/* nothing to read: the pin was never made whole (a maker interrupted), used stays 0 */
	if (read(out[0], &used, sizeof used) != (ssize_t)sizeof used)
		used = 0;
	close(out[0]);
	waitpid(child, NULL, 0);
	if (umount2(pin, MNT_DETACH | UMOUNT_NOFOLLOW) != 0 && errno != EINVAL && errno != ENOENT)
		return fail("cannot unmount the pin %s: %s", pin, strerror(errno));
	if (unlink(pin) != 0 && errno != ENOENT)
		return fail("cannot remove the pin %s: %s", pin, strerror(errno));
	printf("shm_used %llu\n", used);
	return 0;
}

static int enter_node_namespace(const char *node_ns)
{
	struct stat mine, node;
	int fd = open(node_ns, O_RDONLY | O_CLOEXEC), error;

	if (fd < 0)
		return 0;
	if (fstat(fd, &node) != 0 || stat("/proc/self/ns/mnt", &mine) != 0) {
		close(fd);
		return fail("cannot stat the mount namespaces: %s", strerror(errno));
	}
	if (node.st_dev == mine.st_dev && node.st_ino == mine.st_ino) {
		close(fd);
		return 0;
	}
	error = setns(fd, CLONE_NEWNS) != 0 ? errno : 0;
	close(fd);
	if (error != 0)
		return fail("cannot enter the node's mount namespace %s: %s (gecod needs "
			    "CAP_SYS_ADMIN and CAP_SYS_CHROOT, and mount namespaces allowed)",
			    node_ns, strerror(error));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "-n") == 0) {
		if (argv[2][0] != '/')
			return fail("NODE_NS must be an absolute path, got '%s'", argv[2]);
		if (enter_node_namespace(argv[2]) != 0)
			return 1;
		argc -= 2;
		argv += 2;
	}
	if (argc >= 5 && argc <= 6 && strcmp(argv[1], "make") == 0)
		return make(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
	if (argc == 3 && strcmp(argv[1], "drop") == 0)
		return drop(argv[2]);
	fprintf(stderr, "usage: geco-mntns [-n NODE_NS] make PIN TMPDIR SHM_BYTES [VARTMPDIR] | "
		"drop PIN\n");
	return 2;
}
