/*
 * geco_qbench.c - time gecod's quarantine round trip as the preload makes it,
 * and the physical floor beneath it on this machine.
 *
 *   geco_qbench rtt --address A --key-file F --job N --task T --clients C
 *                   --requests R [--cwd DIR] [--timeout-ms MS]
 *       C forked clients, released together, each sending R JOB_STARTED
 *       requests for its own pid with geco_client_job_started() -- the very
 *       call the preload makes: connect, MAC'd frame, verified ack. Timed from
 *       before connect to after the verified ack. DIR: each client's cwd
 *       (gecod finds the job from the client's cwd). MS: the deadline of
 *       one request (30000; a refused connect is retried until then).
 *   geco_qbench floor-socket --requests R [--clients C]
 *       a bare Unix-socket round trip of the same sizes (a JOB_STARTED frame
 *       out, an ACK frame back) against forked servers that do no work, as
 *       many as gecod has lane threads (one per cpu, at most 4).
 *   geco_qbench floor-cgroup --cgroup-procs PATH[,PATH...] --requests R
 *       one write of our pid into each PATH (open O_WRONLY, write, close, as
 *       gecod moves a process): the kernel's share of a quarantine (all of a
 *       job's hierarchies: every move it makes). Before each, untimed writes
 *       move us back to each PATH's parent cgroup, so each is a real move.
 *   geco_qbench floor-cgroup-again --cgroup-procs PATH[,PATH...] --requests R
 *       the same writes into the cgroups we are already in: what the kernel
 *       takes for the rtt runs' later requests, whose clients are in the job.
 *
 * Why: gecod's figures mean little without the floor beside them -- what a
 * socket round trip and a cgroup.procs write cost here, with no gecod at all.
 * Each mode prints one JSON line (latencies in microseconds; wall_s from the
 * release of the clients to the last one's exit) and exits 0 only if every
 * request succeeded. Not part of the library; not installed.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "geco_client.h"
#include "geco_config.h" /* DEFAULT_MAX_SKEW_MS: the preload's default */
#include "geco_job.h"
#include "geco_proto.h"

#define FAILED UINT64_MAX /* a latency slot of a failed request */
#define ERR_MAX 256

/* Shared with the children (MAP_SHARED): one latency per request, and each
   child's first error with the time it happened. */
typedef struct {
    uint64_t when_ns;
    char text[ERR_MAX];
} first_error_t;

static struct {
    const char *mode, *address, *key_file, *cwd, *procs;
    uint64_t job, task;
    long clients, requests, timeout_ms;
} opt = {.task = 1, .clients = 1, .timeout_ms = 30000};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "geco_qbench: %s\n", what);
    exit(2);
}

static void usage(void)
{
    die("usage: geco_qbench rtt --address A --key-file F --job N --task T --clients C "
        "--requests R [--cwd DIR] [--timeout-ms MS]\n"
        "       geco_qbench floor-socket --requests R\n"
        "       geco_qbench floor-cgroup[-again] --cgroup-procs PATH --requests R");
}

static uint64_t number(const char *s, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *s < '0' || *s > '9' || *end != '\0' || v < 1 || v > max)
        usage();
    return v;
}

/* a job or task id as Grid Engine writes it (geco_job.h); 0: refused */
static uint64_t job_number(uint64_t id)
{
    if (id == 0)
        usage();
    return id;
}

static void parse_args(int argc, char **argv)
{
    if (argc < 2)
        usage();
    opt.mode = argv[1];
    for (int i = 2; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(k, "--address") == 0) opt.address = v;
        else if (strcmp(k, "--key-file") == 0) opt.key_file = v;
        else if (strcmp(k, "--cwd") == 0) opt.cwd = v;
        else if (strcmp(k, "--cgroup-procs") == 0) opt.procs = v;
        else if (strcmp(k, "--job") == 0) opt.job = job_number(geco_job_id(v, strlen(v)));
        else if (strcmp(k, "--task") == 0) opt.task = job_number(geco_task_id(v, strlen(v)));
        else if (strcmp(k, "--clients") == 0) opt.clients = (long)number(v, 10000);
        else if (strcmp(k, "--requests") == 0) opt.requests = (long)number(v, 100000000);
        else if (strcmp(k, "--timeout-ms") == 0) opt.timeout_ms = (long)number(v, 3600000);
        else usage();
    }
    if (opt.requests == 0)
        usage();
}

/* Keep the first error only; `what` and `detail` joined as "what: detail". */
static void fail(first_error_t *e, const char *what, const char *detail)
{
    if (e->text[0] != '\0')
        return;
    e->when_ns = now_ns();
    snprintf(e->text, sizeof e->text, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
}

/* ------------------------------------------------------------------------- */
/* one request of each kind; returns 0 or -1 with *err filled                */
/* ------------------------------------------------------------------------- */

static geco_address_t addr;
static uint8_t key[GECO_KEY_BYTES];

static int rtt_once(first_error_t *err)
{
    geco_client_outcome_t out;
    int r = geco_client_job_started(&addr, key, (int)opt.timeout_ms,
                                    (int64_t)DEFAULT_MAX_SKEW_MS * 1000000, opt.job, opt.task,
                                    (uint32_t)getpid(), &out);
    if (r == GECO_CLIENT_OK)
        return 0;
    const char *detail = out.sys_errno != 0 ? strerrorname_np(out.sys_errno)
                         : r == GECO_CLIENT_E_STATUS ? geco_status_name(out.status)
                         : r == GECO_CLIENT_E_FRAME ? geco_strerror(out.proto_err)
                         : r == GECO_CLIENT_E_TIMEOUT ? out.phase : NULL;
    fail(err, geco_client_strresult(r), detail);
    return -1;
}

static struct sockaddr_un floor_addr = {.sun_family = AF_UNIX};
static uint8_t request[GECO_MAX_FRAME], reply[GECO_MAX_FRAME];
static size_t request_len, reply_len;

/* Move exactly len bytes: send (out = 1) or recv (out = 0); 0 or -1 (errno). */
static int move_all(int fd, uint8_t *buf, size_t len, int out)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = out ? send(fd, buf + done, len - done, MSG_NOSIGNAL)
                        : recv(fd, buf + done, len - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            errno = n == 0 ? ECONNRESET : errno;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

static int socket_once(first_error_t *err)
{
    const char *what = NULL;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        what = "socket";
    else if (connect(fd, (struct sockaddr *)&floor_addr, sizeof floor_addr) != 0)
        what = "connect";
    else if (move_all(fd, request, request_len, 1) != 0)
        what = "send";
    else if (move_all(fd, reply, reply_len, 0) != 0)
        what = "recv";
    if (what != NULL)
        fail(err, what, strerrorname_np(errno));
    if (fd >= 0)
        close(fd);
    return what != NULL ? -1 : 0;
}

/* The floor's server: accept, read one request, answer, close; until killed. */
static void serve(int lfd)
{
    uint8_t buf[GECO_MAX_FRAME];
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        if (move_all(fd, buf, request_len, 0) == 0)
            (void)move_all(fd, reply, reply_len, 1);
        close(fd);
    }
}

#define MAX_TARGETS 16
static char targets[MAX_TARGETS][4096]; /* the cgroup.procs files a move writes */
static char parents[MAX_TARGETS][4096]; /* cgroup.procs of each one's parent cgroup */
static int ntargets;

/* Write our pid into a cgroup.procs as gecod does: open, one write, close. */
static int write_pid(const char *procs, const char *what, first_error_t *err)
{
    char pid[24], text[64];
    int len = snprintf(pid, sizeof pid, "%d", (int)getpid());
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    const char *step = fd < 0 ? "open" : write(fd, pid, (size_t)len) != len ? "write" : NULL;
    if (fd >= 0 && close(fd) != 0 && step == NULL)
        step = "close";
    if (step == NULL)
        return 0;
    snprintf(text, sizeof text, "%s: %s", what, step);
    fail(err, text, strerrorname_np(errno));
    return -1;
}

/* A write into the cgroup we are already in costs next to nothing: each
   request first moves us back to the parent cgroup (untimed), so every
   timed write is a real move, as gecod's is. */
static int cgroup_once(first_error_t *err)
{
    for (int i = 0; i < ntargets; i++)
        if (write_pid(targets[i], "cgroup.procs", err) != 0)
            return -1;
    return 0;
}

static int cgroup_back(first_error_t *err)
{
    for (int i = 0; i < ntargets; i++)
        if (write_pid(parents[i], "moving back to the parent cgroup", err) != 0)
            return -1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* the run: children released together, latencies back through shared memory */
/* ------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run(int (*once)(first_error_t *), int (*before)(first_error_t *))
{
    size_t total = (size_t)opt.clients * (size_t)opt.requests;
    size_t bytes = total * sizeof(uint64_t) + (size_t)opt.clients * sizeof(first_error_t);
    pid_t *pids = calloc((size_t)opt.clients, sizeof *pids);
    uint64_t *lat = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int barrier[2];
    if (pids == NULL || lat == MAP_FAILED || pipe2(barrier, O_CLOEXEC) != 0)
        die("cannot set up: out of memory or file descriptors");
    first_error_t *errs = (first_error_t *)(lat + total);

    fflush(stdout);
    for (long c = 0; c < opt.clients; c++) {
        pid_t pid = pids[c] = fork();
        if (pid < 0)
            die("fork failed");
        if (pid > 0)
            continue;
        char byte;
        close(barrier[1]);
        if (opt.cwd != NULL && chdir(opt.cwd) != 0) {
            fail(&errs[c], "chdir", strerrorname_np(errno));
            for (long r = 0; r < opt.requests; r++)
                lat[c * opt.requests + r] = FAILED;
            _exit(1);
        }
        while (read(barrier[0], &byte, 1) < 0 && errno == EINTR)
            ; /* EOF: the parent closed the pipe, everyone starts */
        for (long r = 0; r < opt.requests; r++) {
            if (before != NULL && before(&errs[c]) != 0) {
                lat[c * opt.requests + r] = FAILED;
                continue;
            }
            uint64_t t0 = now_ns();
            int rc = once(&errs[c]);
            lat[c * opt.requests + r] = rc == 0 ? now_ns() - t0 : FAILED;
        }
        _exit(0);
    }
    close(barrier[0]);
    uint64_t start = now_ns();
    close(barrier[1]);
    for (long c = 0; c < opt.clients; c++)
        while (waitpid(pids[c], NULL, 0) < 0 && errno == EINTR)
            ;
    double wall = (double)(now_ns() - start) / 1e9;

    size_t ok = 0;
    for (size_t i = 0; i < total; i++)
        if (lat[i] != FAILED)
            lat[ok++] = lat[i];
    qsort(lat, ok, sizeof *lat, cmp_u64);
    const first_error_t *first = NULL;
    for (long c = 0; c < opt.clients; c++)
        if (errs[c].text[0] != '\0' && (first == NULL || errs[c].when_ns < first->when_ns))
            first = &errs[c];
#define PCT(p) (ok ? (double)lat[(size_t)((double)(ok - 1) * (p) + 0.5)] / 1e3 : 0.0)
    printf("{\"clients\":%ld,\"requests\":%zu,\"ok\":%zu,\"failed\":%zu,\"first_error\":\"",
           opt.clients, total, ok, total - ok);
    for (const char *s = first ? first->text : ""; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        putchar((unsigned char)*s < 0x20 ? '?' : *s);
    }
    printf("\",\"wall_s\":%.6f,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
           "\"max_us\":%.1f,\"rate_per_s\":%.1f}\n",
           wall, PCT(0.50), PCT(0.90), PCT(0.99), PCT(1.0), wall > 0 ? (double)ok / wall : 0.0);
    return ok == total ? 0 : 1;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    if (geco_proto_init() != 0)
        die("libsodium failed to initialise");

    if (strcmp(opt.mode, "rtt") == 0) {
        const char *why = "";
        uint8_t extra[GECO_KEY_BYTES + 1];
        if (opt.address == NULL || opt.key_file == NULL || opt.job == 0)
            usage();
        if (geco_address_parse(opt.address, &addr, &why) != 0)
            die(why);
        FILE *f = fopen(opt.key_file, "rb");
        if (f == NULL || fread(extra, 1, sizeof extra, f) != GECO_KEY_BYTES)
            die("the key file must hold exactly 32 bytes");
        fclose(f);
        memcpy(key, extra, GECO_KEY_BYTES);
        return run(rtt_once, NULL);
    }
    bool again = strcmp(opt.mode, "floor-cgroup-again") == 0;
    if (again || strcmp(opt.mode, "floor-cgroup") == 0) {
        if (opt.procs == NULL)
            usage();
        for (const char *p = opt.procs; *p != '\0' && ntargets < MAX_TARGETS;) {
            size_t len = strcspn(p, ",");
            char *t = targets[ntargets];
            snprintf(t, sizeof targets[0], "%.*s", (int)len, p);
            /* <parent>/<cgroup>/cgroup.procs -> <parent>/cgroup.procs */
            const char *slash = strrchr(t, '/');
            int dirlen = slash != NULL ? (int)(slash - t) : 0;
            while (dirlen > 0 && t[dirlen - 1] != '/')
                dirlen--;
            if (dirlen == 0)
                die("--cgroup-procs takes paths <parent cgroup>/<cgroup>/cgroup.procs");
            snprintf(parents[ntargets++], sizeof parents[0], "%.*scgroup.procs", dirlen, t);
            p += len + (p[len] == ',');
        }
        opt.clients = 1;
        if (!again)
            return run(cgroup_once, cgroup_back);
        /* in, untimed, so every timed write finds us there (a failure shows again in
           the timed writes, reported as floor-cgroup reports it) */
        first_error_t ignored = {0};
        (void)cgroup_once(&ignored);
        return run(cgroup_once, NULL);
    }
    if (strcmp(opt.mode, "floor-socket") != 0)
        usage();

    /* real frames (any key) give the exact sizes a quarantine moves */
    geco_job_started_t msg = {.job_id = 1, .task_id = 1, .pid = 1};
    geco_ack_t ack = {.job_id = 1, .task_id = 1, .status = GECO_OK};
    long n = geco_encode_job_started(request, sizeof request, GECO_JOB_STARTED, key, NULL, 0, &msg);
    long m = geco_encode_ack(reply, sizeof reply, key, NULL, 0, &ack);
    char dir[] = "/tmp/geco-qbench-XXXXXX";
    if (n < 0 || m < 0 || mkdtemp(dir) == NULL)
        die("cannot set up the floor-socket run");
    request_len = (size_t)n;
    reply_len = (size_t)m;
    snprintf(floor_addr.sun_path, sizeof floor_addr.sun_path, "%s/s", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&floor_addr, sizeof floor_addr) != 0
        || listen(lfd, 128) != 0)
        die("cannot listen on the floor-socket socket");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nservers = cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus;
    pid_t servers[4];
    for (int i = 0; i < nservers; i++) {
        servers[i] = fork();
        if (servers[i] == 0)
            serve(lfd);
        if (servers[i] < 0)
            die("fork failed");
    }
    close(lfd);
    int rc = run(socket_once, NULL);
    for (int i = 0; i < nservers; i++) {
        kill(servers[i], SIGKILL);
        waitpid(servers[i], NULL, 0);
    }
    unlink(floor_addr.sun_path);
    rmdir(dir);
    return rc;
}
