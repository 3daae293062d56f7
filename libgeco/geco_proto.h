/*
 * geco_proto.h - gecod's wire format (protocol 1), C side.
 *
 * The byte-by-byte layout, the receiver's check order and test vectors are
 * in docs/wire-format.md; tests/unit/test_proto_c.py holds this code to the
 * same vectors as the Python implementation (geco/wire/).
 *
 * No malloc, no stdio, no global mutable state: safe in any thread and in a
 * child between fork() and exec() (only memcpy and libsodium calls).
 */
#ifndef GECO_PROTO_H
#define GECO_PROTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GECO_PROTO_VERSION 1
#define GECO_KEY_BYTES 32
#define GECO_NONCE_BYTES 16
#define GECO_HEADER_BYTES 36
#define GECO_MAC_BYTES 32
#define GECO_MAX_PAYLOAD 4096
#define GECO_MAX_FRAME (GECO_HEADER_BYTES + GECO_MAX_PAYLOAD + GECO_MAC_BYTES)
/* JOB_STARTED, QUARANTINE_SELF and HOOK: job, task, pid, and one more field */
#define GECO_JOB_STARTED_BYTES 24

enum geco_type { GECO_JOB_STARTED = 1, GECO_ACK = 2, GECO_STATUS = 3, GECO_STATUS_REPLY = 4,
                 GECO_ADOPT = 5, GECO_QUARANTINE_SELF = 6, GECO_ADOPT_REPLY = 7, GECO_HOOK = 8,
                 GECO_STARTER = 9, GECO_STARTER_REPLY = 10,
                 /* between gecods (geco/wire/cluster.py), never on the preload's socket: named
                    here so that the two sides keep one numbering */
                 GECO_PREPARE = 11, GECO_ABORT = 12, GECO_RELEASE = 13, GECO_NODE_REPLY = 14,
                 GECO_NODE_STATUS = 15, GECO_OOM_REPORT = 16,
                 GECO_CALLERID = 17 };
/* HOOK's hooks: the Grid Engine hook whose work gecod does for root's hook program */
enum geco_hook_name { GECO_HOOK_PROLOG = 1, GECO_HOOK_EPILOG = 2 };
/* ADOPT's stages: decide only (PAM account), decide and move the sender (PAM session),
   move the sender, an ssh session's process about to run something (the preload in sshd;
   peer-credentialed: it runs as the user and holds no key) */
enum geco_adopt_stage { GECO_ADOPT_ACCOUNT = 1, GECO_ADOPT_SESSION = 2, GECO_ADOPT_EXEC = 3 };
#define GECO_PEERCRED 0x0001
#define GECO_ADOPT_FIXED_BYTES 32
#define GECO_ADOPT_MAX_CONNECTION 255
#define GECO_REPLY_MAX_TEXT 2048
enum geco_status { GECO_OK = 0, GECO_REFUSED = 1, GECO_NO_SUCH_JOB = 2, GECO_FAILED = 3,
                   GECO_BAD_REQUEST = 4, GECO_VERSION = 5, GECO_BUSY = 6,
                   GECO_REQUEUE = 7, /* HOOK: done by gecod, the job is re-queued (exit 99) */
                   GECO_HOLD = 8 /* HOOK: done by gecod, the job is held in error (exit 100) */ };
/* errors returned (negative) by the decoders */
enum geco_err { GECO_E_SHORT = -1, GECO_E_MAGIC = -2, GECO_E_VERSION = -3, GECO_E_FLAGS = -4,
                GECO_E_LENGTH = -5, GECO_E_MAC = -6, GECO_E_TYPE = -7, GECO_E_PAYLOAD = -8,
                GECO_E_STALE = -9, GECO_E_NONCE = -10 };

typedef struct { uint64_t job_id, task_id; uint32_t pid; } geco_job_started_t;
typedef struct { uint64_t job_id, task_id; uint32_t status; uint8_t request_nonce[16]; } geco_ack_t;
/* ADOPT: "may uid log in here, and into which job" (stage ACCOUNT), "and move pid there"
   (stage SESSION, EXEC). job_id 0: gecod chooses. connection: SSH_CONNECTION,
   NUL-terminated. peercred: a PEERCRED frame (stage EXEC), MAC'd with the public key. */
typedef struct {
    uint64_t job_id, task_id;
    uint32_t pid, uid, stage;
    const char *connection;
    int peercred;
} geco_adopt_t;

/* STARTER: "I am pid of job_id.task_id, to start argv: how would Grid Engine start it?"
   environ: the values of GECO_STARTER_ENVIRON (NULL = unset). Always PEERCRED: the
   starter runs as the job owner, who has no key. */
#define GECO_STARTER_NENVIRON 4
#define GECO_STARTER_ENVIRON \
    {"SGE_STARTER_SHELL_PATH", "SGE_STARTER_SHELL_START_MODE", "SGE_STARTER_USE_LOGIN_SHELL", \
     "JOB_SCRIPT"}
typedef struct {
    uint64_t job_id, task_id;
    uint32_t pid;
    const char *environ[GECO_STARTER_NENVIRON];
    int argc;
    char *const *argv;
} geco_starter_t;

int geco_proto_init(void);  /* sodium_init(); 0 ok */

/* Encode a JOB_STARTED (or QUARANTINE_SELF via type) frame. nonce == NULL: random; ts_ns == 0: now.
   Returns frame length (GECO_HEADER_BYTES+24+GECO_MAC_BYTES) or negative if cap too small. */
long geco_encode_job_started(uint8_t *buf, size_t cap, int type, const uint8_t key[GECO_KEY_BYTES],
                             const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg);

/* Encode a HOOK frame: "do hook's work for job_id.task_id; I am pid" (msg->pid the sender).
   Returns the frame length or a negative enum geco_err. */
long geco_encode_hook(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                      const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg,
                      uint32_t hook);

/* Encode an ADOPT frame (its connection text at most GECO_ADOPT_MAX_CONNECTION bytes).
   Returns the frame length or a negative enum geco_err. */
long geco_encode_adopt(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                       const uint8_t *nonce, int64_t ts_ns, const geco_adopt_t *msg);
/* Encode a STARTER frame (PEERCRED, MAC'd with the public key). Returns the frame length,
   or GECO_E_PAYLOAD when it does not fit in GECO_MAX_PAYLOAD, GECO_E_SHORT for a small cap. */
long geco_encode_starter(uint8_t *buf, size_t cap, const uint8_t *nonce, int64_t ts_ns,
                         const geco_starter_t *msg);
/* Encode an ACK (used by tests and any C server). */
long geco_encode_ack(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                     const uint8_t *nonce, int64_t ts_ns, const geco_ack_t *msg);

/* Verify and decode an ACK frame answering `request_nonce`. now_ns == 0: now.
   Returns 0 or a negative enum geco_err. */
int geco_decode_ack(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                    const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now_ns,
                    int64_t max_skew_ns, geco_ack_t *out);

/* Verify and decode an ADOPT_REPLY frame answering `request_nonce`: its ack part into
   *out, its text (at most GECO_REPLY_MAX_TEXT bytes) into text[cap], NUL-terminated
   (cap > GECO_REPLY_MAX_TEXT never truncates). peercred: the request was a PEERCRED
   frame, so the reply must be one (and key the public one). Returns 0 or a negative
   enum geco_err. */
int geco_decode_adopt_reply(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                            const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now_ns,
                            int64_t max_skew_ns, int peercred, geco_ack_t *out, char *text,
                            size_t cap);
/* Verify and decode a (PEERCRED) STARTER_REPLY answering `request_nonce`: its ack part into
   *out, its NUL-terminated strings (program, argument count, arguments, environment
   changes; none unless OK) into strings[cap] (cap >= GECO_MAX_PAYLOAD never truncates;
   a reply that would be truncated is refused as GECO_E_PAYLOAD), their length in *len.
   Returns 0 or a negative enum geco_err. */
int geco_decode_starter_reply(const uint8_t *buf, size_t len,
                              const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now_ns,
                              int64_t max_skew_ns, geco_ack_t *out, char *strings, size_t cap,
                              size_t *strings_len);
/* Verify and decode a JOB_STARTED request (no flags), as gecod receives it. now_ns == 0:
   now. Returns 0 or a negative enum geco_err (the replay cache is the caller's). */
int geco_decode_job_started(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                            int64_t now_ns, int64_t max_skew_ns, geco_job_started_t *out);
/* Nonce of an encoded frame (bytes 12..27), for the client to remember. */
const uint8_t *geco_frame_nonce(const uint8_t *frame);
/* What a header alone (a frame's first GECO_HEADER_BYTES bytes) tells a reader that has
   not the rest yet. geco_check_header: 0, or the first of GECO_E_MAGIC, GECO_E_VERSION,
   GECO_E_LENGTH (payload over GECO_MAX_PAYLOAD) it shows, so that a foreign or oversized
   frame is refused before waiting for bytes that may never come. geco_frame_length: the
   whole frame's length it announces (header, payload, MAC), or GECO_E_LENGTH; nothing
   else is checked. */
int geco_check_header(const uint8_t *header);
long geco_frame_length(const uint8_t *header);

const char *geco_strerror(int err);  /* static strings */

#ifdef __cplusplus
}
#endif

#endif /* GECO_PROTO_H */
