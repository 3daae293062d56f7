/*
 * geco_client.h - the preload's side of one quarantine request to gecod.
 *
 * Everything here runs inside the process that is about to exec sge_shepherd
 * (sge_execd's forked child, possibly of a multithreaded parent): no malloc,
 * no stdio, no locks, no global mutable state; buffers live on the stack and
 * every wait has a deadline. The only exception is geco_address_parse(),
 * which may consult NSS for a `service:<name>` address and therefore runs
 * once, in the library's constructor.
 */
#ifndef GECO_CLIENT_H
#define GECO_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "geco_proto.h"

/* Where gecod listens, resolved once: connecting later needs no lookups. */
typedef struct {
    struct sockaddr_storage addr;
    socklen_t addrlen;
} geco_address_t;

/*
 * Parse an address as the seed defines it: `path:<abs path>` or a bare
 * leading `/` (Unix stream socket); `port:<n>`, `service:<name|port>` or bare
 * digits (TCP on 127.0.0.1).
 * Returns 0, or -1 with *why pointing at a static sentence naming the problem.
 */
int geco_address_parse(const char *text, geco_address_t *out, const char **why);

/*
 * A whole number in 1..max written in decimal digits only (no sign, no white
 * space); else -1. max must be below LONG_MAX / 10, so no digit can
 * overflow. Ports and the preload.conf millisecond values are read with it.
 */
long geco_parse_count(const char *s, long max);

/* Outcomes of one JOB_STARTED request. */
enum geco_client_result {
    GECO_CLIENT_OK = 0,
    GECO_CLIENT_E_ENCODE,   /* the frame could not be built (a bug) */
    GECO_CLIENT_E_SOCKET,   /* socket() failed: sys_errno */
    GECO_CLIENT_E_CONNECT,  /* connect() failed: sys_errno (after retries) */
    GECO_CLIENT_E_SEND,     /* send() failed: sys_errno */
    GECO_CLIENT_E_RECV,     /* recv() failed: sys_errno */
    GECO_CLIENT_E_TIMEOUT,  /* the deadline passed (phase says where) */
    GECO_CLIENT_E_CLOSED,   /* gecod closed the connection before a whole reply */
    GECO_CLIENT_E_FRAME,    /* the reply failed verification: proto_err */
    GECO_CLIENT_E_MISMATCH, /* a valid ack for another job/task */
    GECO_CLIENT_E_STATUS,   /* gecod answered, but not OK: status */
    GECO_CLIENT_E_NOT_GECOD, /* a peer-credentialed request found no root listener on a Unix
                                socket there (TCP, or another uid): nothing was sent */
};

typedef struct {
    int result;         /* enum geco_client_result */
    int sys_errno;      /* CONNECT, SOCKET, SEND, RECV */
    int proto_err;      /* FRAME: a negative enum geco_err */
    uint32_t status;    /* STATUS: enum geco_status */
    const char *phase;  /* "connect", "send" or "reply": where it failed */
    unsigned attempts;  /* connections tried (connect refused/BUSY are retried) */
    geco_ack_t ack;     /* the verified ack (OK, MISMATCH, STATUS) */
} geco_client_outcome_t;

/*
 * Send JOB_STARTED(job, task, pid) to gecod and wait for its verified ack,
 * all within timeout_ms. A refused connection (gecod restarting) and a BUSY
 * answer are retried with a growing pause until the deadline.
 * Returns out->result (GECO_CLIENT_OK only for a verified OK ack for exactly
 * this job/task, bound to this request's nonce).
 */
int geco_client_job_started(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                            int timeout_ms, int64_t max_skew_ns, uint64_t job, uint64_t task,
                            uint32_t pid, geco_client_outcome_t *out);
/*
 * Send HOOK(job, task, pid, hook) and wait for gecod's verified ack within
 * timeout_ms, on one connection (no retry: the caller has a fallback that is never
 * wrong, doing the work itself). GECO_CLIENT_OK means gecod did the hook's work.
 */
int geco_client_hook(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                     int timeout_ms, int64_t max_skew_ns, uint64_t job, uint64_t task,
                     uint32_t pid, uint32_t hook, geco_client_outcome_t *out);
/*
 * Peer-credentialed requests (STARTER, and ADOPT with msg->peercred) are MAC'd with the
 * public key, so their reply's MAC proves nothing: they go only to a Unix socket whose
 * listener the kernel names root (SO_PEERCRED). Over TCP, or to another uid's socket,
 * nothing is sent and the result is GECO_CLIENT_E_NOT_GECOD (not retried).
 *
 * Send STARTER(msg), peer-credentialed, and wait for gecod's verified STARTER_REPLY within
 * timeout_ms, on one connection (no retry: the caller runs the Python starter instead).
 * The reply's strings go to strings[cap] (cap >= GECO_MAX_PAYLOAD), their length to
 * *strings_len. GECO_CLIENT_OK: gecod said how to start the job.
 */
int geco_client_starter(const geco_address_t *addr, int timeout_ms, int64_t max_skew_ns,
                        const geco_starter_t *msg, char *strings, size_t cap,
                        size_t *strings_len, geco_client_outcome_t *out);
/*
 * Send ADOPT(msg) to gecod and wait for its verified ADOPT_REPLY within timeout_ms
 * (retries as above). The reply's text (a line for the user, then NAME=value lines of
 * the session's environment) goes to text[cap], NUL-terminated. A refusal is result
 * GECO_CLIENT_E_STATUS with status GECO_REFUSED, and its text says why.
 */
int geco_client_adopt(const geco_address_t *addr, const uint8_t key[GECO_KEY_BYTES],
                      int timeout_ms, int64_t max_skew_ns, const geco_adopt_t *msg, char *text,
                      size_t cap, geco_client_outcome_t *out);
const char *geco_client_strresult(int result);
const char *geco_status_name(uint32_t status);

#endif /* GECO_CLIENT_H */
