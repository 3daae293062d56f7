/*
 * geco_client.c - one quarantine request from the preload to gecod.
 *
 * Runs in the process that is about to exec sge_shepherd: sge_execd's child
 * right after fork(), whose parent may have had other threads holding the
 * malloc or stdio locks at that moment. Hence the rules of this file:
 *   - no malloc, no stdio, no locks, no global mutable state: every buffer is
 *     on the stack (the largest is one reply frame, ~4 KiB);
 *   - every wait has one deadline (CLOCK_MONOTONIC), shared by connect, send
 *     and the reply, so the caller never waits longer than timeout_ms;
 *   - sockets are close-on-exec and send() uses MSG_NOSIGNAL: a gecod that
 *     goes away mid-request must not kill sge_execd's child with SIGPIPE;
 *   - one cleanup path per function (goto cleanup), so no early return can
 *     leak a descriptor into the shepherd.
 * geco_address_parse() is the exception: a `service:<name>` address needs
 * getservbyname_r() (NSS), so the preload calls it once, in its constructor.
 */
#define _GNU_SOURCE

#include "geco_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_MS 1000000LL
/* Pause between retries of a refused, closed or reset connection or a BUSY answer: doubling
   from 50 ms to at most 1 s, always within the request's deadline. */
#define RETRY_FIRST_NS (50 * NS_PER_MS)
#define RETRY_MAX_NS (1000 * NS_PER_MS)

/* ------------------------------------------------------------------------- */
/* addresses                                                                 */
/* ------------------------------------------------------------------------- */

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

long geco_parse_count(const char *s, long max)
{
    long v = 0;
    if (*s == '\0')
        return -1;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
        if (v > max)
            return -1;
    }
    return v == 0 ? -1 : v;
}

static int all_digits(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s != '\0'; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static int set_unix(const char *path, geco_address_t *out, const char **why)
{
    struct sockaddr_un *un = (struct sockaddr_un *)&out->addr;
    size_t len = strlen(path);
    if (path[0] != '/') {
        *why = "a Unix socket path must be absolute";
        return -1;
    }
    if (len >= sizeof un->sun_path) {
        *why = "a Unix socket path must be shorter than 108 bytes";
        return -1;
    }
    un->sun_family = AF_UNIX;
    memcpy(un->sun_path, path, len + 1);
    out->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
    return 0;
}

static void set_loopback(long port, geco_address_t *out)
{
    struct sockaddr_in *in = (struct sockaddr_in *)&out->addr;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    out->addrlen = sizeof *in;
}

int geco_address_parse(const char *text, geco_address_t *out, const char **why)
{
    static const char forms[] = "expected path:<absolute path>, port:<1-65535>, "
                                "service:<name|port>, a port number or an absolute path";
    long port;
    memset(out, 0, sizeof *out);
    *why = forms;
    if (text == NULL || *text == '\0')
        return -1;
    if (has_prefix(text, "path:"))
        return set_unix(text + 5, out, why);
    if (text[0] == '/')
        return set_unix(text, out, why);
    if (has_prefix(text, "port:") || all_digits(text)) {
        port = geco_parse_count(has_prefix(text, "port:") ? text + 5 : text, 65535);
        if (port < 0) {
            *why = "a port must be a number in 1..65535";
            return -1;
        }
        set_loopback(port, out);
        return 0;
    }
    if (has_prefix(text, "service:")) {
        const char *name = text + 8;
        if (all_digits(name)) {
            port = geco_parse_count(name, 65535);
            if (port < 0) {
                *why = "a port must be a number in 1..65535";
                return -1;
            }
        } else {
            struct servent se, *found = NULL;
            char buf[1024];
            if (*name == '\0' || getservbyname_r(name, "tcp", &se, buf, sizeof buf, &found) != 0
                || found == NULL) {
                *why = "unknown TCP service name (not in /etc/services)";
                return -1;
            }
            port = ntohs((uint16_t)found->s_port);
        }
        set_loopback(port, out);
        return 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------- */
/* the request                                                               */
/* ------------------------------------------------------------------------- */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait until fd is ready for `events` or the deadline passes.
   Returns 0 ready (or in error: the next call says which), 1 deadline, -1 poll failed. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ns();
        if (left <= 0)
            return 1;
        /* round up: a 0.4 ms remainder must not become a busy poll(0) */
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int n = poll(&p, 1, (int)((left + NS_PER_MS - 1) / NS_PER_MS));
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static int fail(geco_client_outcome_t *out, int result, const char *phase, int err)
{
    out->result = result;
    out->phase = phase;
    out->sys_errno = err;
    return result;
}

/* Wait for fd (wait_fd) on behalf of `phase`: GECO_CLIENT_OK when ready, else the
   failure: a timeout, or `result` with poll's errno. */
static int wait_or_fail(int fd, short events, int64_t deadline, int result, const char *phase,
                        geco_client_outcome_t *out)
{
    switch (wait_fd(fd, events, deadline)) {
    case 0:
        return GECO_CLIENT_OK;
    case 1:
        return fail(out, GECO_CLIENT_E_TIMEOUT, phase, ETIMEDOUT);
    default:
        return fail(out, result, phase, errno);
    }
}

/* connect(2) as root where the process may take root back.
   sge_execd's children exec the shepherd with the admin user's effective uid
   (real uid root), and gecod's privileged socket is root's alone (mode 0600):
   the kernel checks a Unix socket's connect against the filesystem uid, and
   setfsuid() changes that uid alone, for this thread alone, and only to an id
   the process already has (its real uid). Restored before returning. */
static int connect_as_root(int fd, const geco_address_t *addr)
{
    int rc, err, raised = 0;
    uid_t before = 0;
    if (addr->addr.ss_family == AF_UNIX && getuid() == 0 && geteuid() != 0) {
        before = (uid_t)setfsuid(0);
        raised = 1;
    }
    rc = connect(fd, (const struct sockaddr *)&addr->addr, addr->addrlen);
    err = errno;
    if (raised)
        setfsuid(before);
    errno = err;
    return rc;
}

static int connect_deadline(int fd, const geco_address_t *addr, int64_t deadline,
                            geco_client_outcome_t *out)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (connect_as_root(fd, addr) == 0)
        return GECO_CLIENT_OK;
    if (errno != EINPROGRESS && errno != EINTR)
        return fail(out, GECO_CLIENT_E_CONNECT, "connect", errno);
    /* TCP (or an interrupted connect) completes in the background */
    int rc = wait_or_fail(fd, POLLOUT, deadline, GECO_CLIENT_E_CONNECT, "connect", out);
    if (rc != GECO_CLIENT_OK)
        return rc;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    return err == 0 ? GECO_CLIENT_OK : fail(out, GECO_CLIENT_E_CONNECT, "connect", err);
}

/* A peer-credentialed request (MAC'd with the public key) may only go to gecod itself: its
   reply's MAC proves nothing, so whoever listens would choose the answer -- another user's
   session environment (LD_PRELOAD lines), what a job execs. Anyone can bind gecod's
   loopback port while gecod is down (port: mode), and over TCP the kernel names no
   listener; on a Unix socket it does: for the connecting side, SO_PEERCRED holds the
   credentials the listener had when it called listen(). So: a Unix socket, root's. */
static int check_listener(int fd, const geco_address_t *addr, geco_client_outcome_t *out)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (addr->addr.ss_family != AF_UNIX)
        return fail(out, GECO_CLIENT_E_NOT_GECOD, "connect", 0);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return fail(out, GECO_CLIENT_E_NOT_GECOD, "connect", errno);
    if (len != sizeof cred || cred.uid != 0)
        return fail(out, GECO_CLIENT_E_NOT_GECOD, "connect", 0);
    return GECO_CLIENT_OK;
}

static int send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline,
                    geco_client_outcome_t *out)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, buf + done, len - done, MSG_NOSIGNAL);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return fail(out, GECO_CLIENT_E_SEND, "send", errno);
        int rc = wait_or_fail(fd, POLLOUT, deadline, GECO_CLIENT_E_SEND, "send", out);
        if (rc != GECO_CLIENT_OK)
            return rc;
    }
    return GECO_CLIENT_OK;
}

/* Read one whole frame: the header first, then the length it announces. */
static int recv_frame(int fd, uint8_t *buf, size_t *len, int64_t deadline,
                      geco_client_outcome_t *out)
{
    size_t got = 0, want = GECO_HEADER_BYTES;
    while (got < want) {
        ssize_t n = recv(fd, buf + got, want - got, 0);
        if (n > 0) {
            got += (size_t)n;
            if (got == GECO_HEADER_BYTES && want == GECO_HEADER_BYTES) {
                /* Refuse a foreign or oversized reply before waiting for the bytes
                   it announces, which may never come. */
                int err = geco_check_header(buf);
                if (err != 0) {
                    out->proto_err = err;
                    return fail(out, GECO_CLIENT_E_FRAME, "reply", 0);
                }
                want = (size_t)geco_frame_length(buf);
            }
            continue;
        }
        if (n == 0)
            return fail(out, GECO_CLIENT_E_CLOSED, "reply", 0);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return fail(out, GECO_CLIENT_E_RECV, "reply", errno);
        int rc = wait_or_fail(fd, POLLIN, deadline, GECO_CLIENT_E_RECV, "reply", out);
        if (rc != GECO_CLIENT_OK)
            return rc;
    }
    *len = got;
    return GECO_CLIENT_OK;
}

/* One request: JOB_STARTED, answered by an ACK for exactly its job and task, or ADOPT,
   answered by an ADOPT_REPLY whose text lands in text[cap]. */
typedef struct {
    const geco_job_started_t *job_started;
    uint32_t hook; /* with job_started: a HOOK, not a JOB_STARTED; asked once (the hook
                      program runs the Python hook rather than wait for gecod) */
    const geco_adopt_t *adopt;
    const geco_starter_t *starter;
    char *text;
    size_t cap;
    size_t *text_len; /* a STARTER_REPLY's strings are counted, not NUL-terminated */
} request_t;

/* One connection: request, verified reply, close. */
static int attempt(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                   int64_t deadline, int64_t max_skew_ns, const request_t *req,
                   geco_client_outcome_t *out)
{
    uint8_t request[GECO_MAX_FRAME];
    uint8_t reply[GECO_MAX_FRAME];
    size_t reply_len = 0;
    int fd = -1, rc, err;
    long n;

    memset(&out->ack, 0, sizeof out->ack);
    out->proto_err = 0;
    out->status = 0;
    /* a fresh nonce and timestamp per attempt: gecod's replay cache would
       refuse a resent frame */
    if (req->adopt != NULL)
        n = geco_encode_adopt(request, sizeof request, key, NULL, 0, req->adopt);
    else if (req->starter != NULL)
        n = geco_encode_starter(request, sizeof request, NULL, 0, req->starter);
    else if (req->hook != 0)
        n = geco_encode_hook(request, sizeof request, key, NULL, 0, req->job_started, req->hook);
    else
        n = geco_encode_job_started(request, sizeof request, GECO_JOB_STARTED, key, NULL, 0,
                                    req->job_started);
    if (n <= 0) {
        rc = fail(out, GECO_CLIENT_E_ENCODE, "send", 0);
        goto cleanup;
    }
    fd = socket(addr->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        rc = fail(out, GECO_CLIENT_E_SOCKET, "connect", errno);
        goto cleanup;
    }
    rc = connect_deadline(fd, addr, deadline, out);
    if (rc != GECO_CLIENT_OK)
        goto cleanup;
    if (req->starter != NULL || (req->adopt != NULL && req->adopt->peercred)) {
        rc = check_listener(fd, addr, out);
        if (rc != GECO_CLIENT_OK)
            goto cleanup;
    }
    rc = send_all(fd, request, (size_t)n, deadline, out);
    if (rc != GECO_CLIENT_OK)
        goto cleanup;
    rc = recv_frame(fd, reply, &reply_len, deadline, out);
    if (rc != GECO_CLIENT_OK)
        goto cleanup;
    if (req->adopt != NULL)
        err = geco_decode_adopt_reply(reply, reply_len, key, geco_frame_nonce(request), 0,
                                      max_skew_ns, req->adopt->peercred, &out->ack, req->text,
                                      req->cap);
    else if (req->starter != NULL)
        err = geco_decode_starter_reply(reply, reply_len, geco_frame_nonce(request), 0,
                                        max_skew_ns, &out->ack, req->text, req->cap,
                                        req->text_len);
    else
        err = geco_decode_ack(reply, reply_len, key, geco_frame_nonce(request), 0, max_skew_ns,
                              &out->ack);
    if (err != 0) {
        out->proto_err = err;
        rc = fail(out, GECO_CLIENT_E_FRAME, "reply", 0);
    } else if (out->ack.status != GECO_OK) {
        /* before the job check: gecod answers a frame it refused unread with job 0.0 */
        out->status = out->ack.status;
        rc = fail(out, GECO_CLIENT_E_STATUS, "reply", 0);
    } else if ((req->job_started != NULL && (out->ack.job_id != req->job_started->job_id
                                             || out->ack.task_id != req->job_started->task_id))
               || (req->starter != NULL && (out->ack.job_id != req->starter->job_id
                                            || out->ack.task_id != req->starter->task_id))) {
        rc = fail(out, GECO_CLIENT_E_MISMATCH, "reply", 0);
    } else {
        rc = fail(out, GECO_CLIENT_OK, "reply", 0);
    }
cleanup:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Worth another connection before the deadline: gecod (re)starting, busy, or
   closing connections it has no room for (a full connection table closes new
   ones unanswered, and the kernel resets one whose request was not read). Not a
   listener that is not gecod's (E_NOT_GECOD): it is what holds the address. */
static int retryable(const geco_client_outcome_t *out)
{
    int e = out->sys_errno;
    switch (out->result) {
    case GECO_CLIENT_E_CONNECT:
        return e == ENOENT || e == ECONNREFUSED || e == EAGAIN || e == ECONNRESET;
    case GECO_CLIENT_E_SEND:
    case GECO_CLIENT_E_RECV:
        return e == EPIPE || e == ECONNRESET;
    case GECO_CLIENT_E_CLOSED:
        return 1;
    case GECO_CLIENT_E_STATUS:
        return out->status == GECO_BUSY;
    default:
        return 0;
    }
}

/* attempt() until an answer that is not worth retrying, or the deadline */
static int request(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                   int timeout_ms, int64_t max_skew_ns, const request_t *req,
                   geco_client_outcome_t *out)
{
    int64_t deadline = mono_ns() + (int64_t)timeout_ms * NS_PER_MS;
    int64_t pause = RETRY_FIRST_NS;

    memset(out, 0, sizeof *out);
    for (;;) {
        out->attempts++;
        attempt(addr, key, deadline, max_skew_ns, req, out);
        if (req->hook != 0 || req->starter != NULL || !retryable(out))
            break;
        int64_t now = mono_ns();
        /* no time left for a pause and another try: report what went wrong,
           which says more than "timed out" */
        if (deadline - now <= pause)
            break;
        struct timespec until = {.tv_sec = (now + pause) / 1000000000,
                                 .tv_nsec = (now + pause) % 1000000000};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
            ;
        pause = pause * 2 > RETRY_MAX_NS ? RETRY_MAX_NS : pause * 2;
    }
    return out->result;
}

int geco_client_job_started(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                            int timeout_ms, int64_t max_skew_ns, uint64_t job, uint64_t task,
                            uint32_t pid, geco_client_outcome_t *out)
{
    const geco_job_started_t msg = {.job_id = job, .task_id = task, .pid = pid};
    const request_t req = {.job_started = &msg};
    return request(addr, key, timeout_ms, max_skew_ns, &req, out);
}

int geco_client_hook(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                     int timeout_ms, int64_t max_skew_ns, uint64_t job, uint64_t task,
                     uint32_t pid, uint32_t hook, geco_client_outcome_t *out)
{
    const geco_job_started_t msg = {.job_id = job, .task_id = task, .pid = pid};
    const request_t req = {.job_started = &msg, .hook = hook};
    return request(addr, key, timeout_ms, max_skew_ns, &req, out);
}

int geco_client_starter(const geco_address_t *addr, int timeout_ms, int64_t max_skew_ns,
                        const geco_starter_t *msg, char *strings, size_t cap,
                        size_t *strings_len, geco_client_outcome_t *out)
{
    static const uint8_t public_key[GECO_KEY_BYTES];
    const request_t req = {.starter = msg, .text = strings, .cap = cap,
                           .text_len = strings_len};
    *strings_len = 0;
    return request(addr, public_key, timeout_ms, max_skew_ns, &req, out);
}

int geco_client_adopt(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                      int timeout_ms, int64_t max_skew_ns, const geco_adopt_t *msg, char *text,
                      size_t cap, geco_client_outcome_t *out)
{
    const request_t req = {.adopt = msg, .text = text, .cap = cap};
    if (cap > 0)
        text[0] = '\0';
    return request(addr, key, timeout_ms, max_skew_ns, &req, out);
}

/* the words for each result and status, indexed by its enum's value (0 up, no gaps) */
#define WORDS_COUNT(words) (sizeof(words) / sizeof(words)[0])

const char *geco_client_strresult(int result)
{
    static const char *const words[] = {
        [GECO_CLIENT_OK] = "ok",
        [GECO_CLIENT_E_ENCODE] = "cannot encode the request",
        [GECO_CLIENT_E_SOCKET] = "cannot create a socket",
        [GECO_CLIENT_E_CONNECT] = "cannot connect",
        [GECO_CLIENT_E_SEND] = "cannot send the request",
        [GECO_CLIENT_E_RECV] = "cannot receive the reply",
        [GECO_CLIENT_E_TIMEOUT] = "timed out",
        [GECO_CLIENT_E_CLOSED] = "gecod closed the connection without a complete reply",
        [GECO_CLIENT_E_FRAME] = "reply rejected",
        [GECO_CLIENT_E_MISMATCH] = "the ack names another job or task",
        [GECO_CLIENT_E_STATUS] = "gecod did not quarantine the job",
        [GECO_CLIENT_E_NOT_GECOD] = "the socket is not gecod's (peer-credentialed requests go "
                                    "only to root's Unix socket)",
    };
    return result >= 0 && (size_t)result < WORDS_COUNT(words) ? words[result] : "unknown result";
}

const char *geco_status_name(uint32_t status)
{
    static const char *const names[] = {
        [GECO_OK] = "OK", [GECO_REFUSED] = "REFUSED", [GECO_NO_SUCH_JOB] = "NO_SUCH_JOB",
        [GECO_FAILED] = "FAILED", [GECO_BAD_REQUEST] = "BAD_REQUEST", [GECO_VERSION] = "VERSION",
        [GECO_BUSY] = "BUSY", [GECO_REQUEUE] = "REQUEUE", [GECO_HOLD] = "HOLD",
    };
    return status < WORDS_COUNT(names) ? names[status] : "UNKNOWN";
}
