/*
 * geco_proto.c - encode and verify gecod's frames (protocol 1).
 *
 * The layout, check order and test vectors are in docs/wire-format.md;
 * geco/wire/ is the Python twin and tests/unit/test_proto_c.py holds
 * both to the vectors in tests/vectors/wire.json.
 *
 * Rules of this file (it runs inside sge_execd and sshd, also in a child
 * between fork() and exec()):
 *   - no malloc, no stdio, no locks, no global mutable state;
 *   - integers are written and read byte by byte as little-endian, never by
 *     casting the buffer to a struct: the wire layout is independent of the
 *     compiler's padding, alignment and the host's byte order;
 *   - only mem*(), strlen, clock_gettime and libsodium are called.
 */
/* clock_gettime() under -std=c11 */
#define _POSIX_C_SOURCE 200809L

#include "geco_proto.h"

#include <string.h>
#include <time.h>

#include <sodium.h>

/* Offsets of the header fields (docs/wire-format.md, "Frame"). */
#define OFF_MAGIC 0
#define OFF_VERSION 4
#define OFF_TYPE 5
#define OFF_FLAGS 6
#define OFF_LENGTH 8
#define OFF_NONCE 12
#define OFF_TIMESTAMP 28

#define ACK_BYTES 40

static const uint8_t MAGIC[4] = {'G', 'E', 'C', 'Q'};

static void store16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void store32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void store64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t load16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t load32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t load64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int geco_proto_init(void)
{
    /* 1 = already initialised by someone else in this process: fine */
    return sodium_init() < 0 ? -1 : 0;
}

/* Write header + payload (already at buf + GECO_HEADER_BYTES) + MAC; return the length. */
static long seal(uint8_t *buf, int type, uint16_t flags, const uint8_t key[GECO_KEY_BYTES],
                 const uint8_t *nonce, int64_t ts_ns, uint32_t payload_len)
{
    memcpy(buf + OFF_MAGIC, MAGIC, sizeof MAGIC);
    buf[OFF_VERSION] = GECO_PROTO_VERSION;
    buf[OFF_TYPE] = (uint8_t)type;
    store16(buf + OFF_FLAGS, flags);
    store32(buf + OFF_LENGTH, payload_len);
    if (nonce != NULL)
        memcpy(buf + OFF_NONCE, nonce, GECO_NONCE_BYTES);
    else
        randombytes_buf(buf + OFF_NONCE, GECO_NONCE_BYTES);
    store64(buf + OFF_TIMESTAMP, (uint64_t)(ts_ns != 0 ? ts_ns : now_ns()));
    size_t body = GECO_HEADER_BYTES + (size_t)payload_len;
    crypto_generichash(buf + body, GECO_MAC_BYTES, buf, body, key, GECO_KEY_BYTES);
    return (long)(body + GECO_MAC_BYTES);
}

/* The 24 bytes that open JOB_STARTED, QUARANTINE_SELF, HOOK and ACK: job, task, then
   `third` (pid, or ACK's status) and `last` (reserved 0, or HOOK's hook). */
static void store_ids(uint8_t *p, uint64_t job, uint64_t task, uint32_t third, uint32_t last)
{
    store64(p, job);
    store64(p + 8, task);
    store32(p + 16, third);
    store32(p + 20, last);
}

/* The 24 bytes of JOB_STARTED, QUARANTINE_SELF and HOOK: job, task, pid, then `last`
   (reserved 0, or HOOK's hook). */
static long encode_ids(uint8_t *buf, size_t cap, int type, const uint8_t key[GECO_KEY_BYTES],
                       const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg,
                       uint32_t last)
{
    if (cap < GECO_HEADER_BYTES + GECO_JOB_STARTED_BYTES + GECO_MAC_BYTES)
        return GECO_E_SHORT;
    store_ids(buf + GECO_HEADER_BYTES, msg->job_id, msg->task_id, msg->pid, last);
    return seal(buf, type, 0, key, nonce, ts_ns, GECO_JOB_STARTED_BYTES);
}

long geco_encode_job_started(uint8_t *buf, size_t cap, int type, const uint8_t key[GECO_KEY_BYTES],
                             const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg)
{
    if (type != GECO_JOB_STARTED && type != GECO_QUARANTINE_SELF)
        return GECO_E_TYPE;
    return encode_ids(buf, cap, type, key, nonce, ts_ns, msg, 0);
}

long geco_encode_hook(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                      const uint8_t *nonce, int64_t ts_ns, const geco_job_started_t *msg,
                      uint32_t hook)
{
    return encode_ids(buf, cap, GECO_HOOK, key, nonce, ts_ns, msg, hook);
}

long geco_encode_adopt(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                       const uint8_t *nonce, int64_t ts_ns, const geco_adopt_t *msg)
{
    size_t n = msg->connection != NULL ? strlen(msg->connection) : 0;
    if (n > GECO_ADOPT_MAX_CONNECTION)
        return GECO_E_PAYLOAD;
    if (cap < GECO_HEADER_BYTES + GECO_ADOPT_FIXED_BYTES + n + GECO_MAC_BYTES)
        return GECO_E_SHORT;
    uint8_t *p = buf + GECO_HEADER_BYTES;
    store64(p, msg->job_id);
    store64(p + 8, msg->task_id);
    store32(p + 16, msg->pid);
    store32(p + 20, msg->uid);
    store32(p + 24, msg->stage);
    store32(p + 28, 0); /* reserved */
    if (n > 0)
        memcpy(p + GECO_ADOPT_FIXED_BYTES, msg->connection, n);
    return seal(buf, GECO_ADOPT, msg->peercred ? GECO_PEERCRED : 0, key, nonce, ts_ns,
                (uint32_t)(GECO_ADOPT_FIXED_BYTES + n));
}

long geco_encode_starter(uint8_t *buf, size_t cap, const uint8_t *nonce, int64_t ts_ns,
                         const geco_starter_t *msg)
{
    static const uint8_t public_key[GECO_KEY_BYTES];
    size_t n = GECO_JOB_STARTED_BYTES, room;
    if (cap < GECO_HEADER_BYTES + GECO_JOB_STARTED_BYTES + GECO_MAC_BYTES)
        return GECO_E_SHORT;
    room = cap - GECO_HEADER_BYTES - GECO_MAC_BYTES;
    if (room > GECO_MAX_PAYLOAD)
        room = GECO_MAX_PAYLOAD;
    uint8_t *p = buf + GECO_HEADER_BYTES;
    store64(p, msg->job_id);
    store64(p + 8, msg->task_id);
    store32(p + 16, msg->pid);
    store32(p + 20, (uint32_t)msg->argc);
    for (int i = 0; i < GECO_STARTER_NENVIRON + msg->argc; i++) {
        const char *w = i < GECO_STARTER_NENVIRON ? msg->environ[i]
                                                  : msg->argv[i - GECO_STARTER_NENVIRON];
        size_t k = w != NULL ? strlen(w) + 1 : 1;
        if (k > room - n)
            return n + k > GECO_MAX_PAYLOAD ? GECO_E_PAYLOAD : GECO_E_SHORT;
        memcpy(p + n, w != NULL ? w : "", k);
        n += k;
    }
    return seal(buf, GECO_STARTER, GECO_PEERCRED, public_key, nonce, ts_ns, (uint32_t)n);
}

long geco_encode_ack(uint8_t *buf, size_t cap, const uint8_t key[GECO_KEY_BYTES],
                     const uint8_t *nonce, int64_t ts_ns, const geco_ack_t *msg)
{
    if (cap < GECO_HEADER_BYTES + ACK_BYTES + GECO_MAC_BYTES)
        return GECO_E_SHORT;
    uint8_t *p = buf + GECO_HEADER_BYTES;
    store_ids(p, msg->job_id, msg->task_id, msg->status, 0); /* then reserved 0 */
    memcpy(p + 24, msg->request_nonce, GECO_NONCE_BYTES);
    return seal(buf, GECO_ACK, 0, key, nonce, ts_ns, ACK_BYTES);
}

/* |a - b| without signed overflow, for any two int64 values. */
static uint64_t distance(int64_t a, int64_t b)
{
    return a > b ? (uint64_t)a - (uint64_t)b : (uint64_t)b - (uint64_t)a;
}

/* 1 when the frame's timestamp is more than max_skew_ns (a negative skew is 0) from now
   (0: the clock's now). */
static int stale(const uint8_t *buf, int64_t now, int64_t max_skew_ns)
{
    int64_t ts = (int64_t)load64(buf + OFF_TIMESTAMP);
    if (now == 0)
        now = now_ns();
    return distance(ts, now) > (uint64_t)(max_skew_ns > 0 ? max_skew_ns : 0);
}

/* A received frame's first checks: is it geco's, and of this protocol? */
static int check_magic_version(const uint8_t *buf)
{
    if (memcmp(buf + OFF_MAGIC, MAGIC, sizeof MAGIC) != 0)
        return GECO_E_MAGIC;
    if (buf[OFF_VERSION] != GECO_PROTO_VERSION)
        return GECO_E_VERSION;
    return 0;
}

/* The checks every received frame passes first, in the protocol's order
   (docs/wire-format.md, "Receiving"): everything up to the MAC is about the frame's
   shape, so an unauthenticated sender learns nothing but that; the rest is trusted only
   after the MAC matched. flags: the only flags word accepted. 0 and the payload length in
   *payload, or a negative enum geco_err. */
static int check_frame(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                       uint16_t flags, uint32_t *payload)
{
    if (len < GECO_HEADER_BYTES + GECO_MAC_BYTES)
        return GECO_E_SHORT;
    int rc = check_magic_version(buf);
    if (rc != 0)
        return rc;
    if (load16(buf + OFF_FLAGS) != flags)
        return GECO_E_FLAGS;
    uint32_t n = load32(buf + OFF_LENGTH);
    if (n > GECO_MAX_PAYLOAD || len != GECO_HEADER_BYTES + (size_t)n + GECO_MAC_BYTES)
        return GECO_E_LENGTH;
    uint8_t mac[GECO_MAC_BYTES];
    size_t body = GECO_HEADER_BYTES + (size_t)n;
    crypto_generichash(mac, sizeof mac, buf, body, key, GECO_KEY_BYTES);
    /* constant time: a byte-by-byte memcmp would tell a forger how much is right */
    if (sodium_memcmp(mac, buf + body, GECO_MAC_BYTES) != 0)
        return GECO_E_MAC;
    *payload = n;
    return 0;
}

/* An ACK, an ADOPT_REPLY (its ack part, then text) or a STARTER_REPLY (its ack part, then
   strings, their length in *text_len), checked in the protocol's order. */
static int decode_reply(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                        const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now,
                        int64_t max_skew_ns, int want, uint16_t flags, geco_ack_t *out,
                        char *text, size_t cap, size_t *text_len)
{
    uint32_t n;
    /* a reply has the flag its request had */
    int rc = check_frame(buf, len, key, flags, &n);
    if (rc != 0)
        return rc;

    int type = buf[OFF_TYPE];
    if (type < GECO_JOB_STARTED || type > GECO_STARTER_REPLY)
        return GECO_E_TYPE;
    if (type != want)
        return GECO_E_TYPE; /* a known type, but not the answer we wait for */
    const uint8_t *p = buf + GECO_HEADER_BYTES;
    uint32_t extra = n >= ACK_BYTES ? n - ACK_BYTES : 0;
    if (n < ACK_BYTES || (want == GECO_ACK && extra != 0) || load32(p + 20) != 0
        || load32(p + 16) > GECO_HOLD)
        return GECO_E_PAYLOAD;
    if (want == GECO_STARTER_REPLY) {
        /* NUL-terminated strings, only in an OK reply, never cut short here */
        if ((extra > 0 && (load32(p + 16) != GECO_OK || p[ACK_BYTES + extra - 1] != '\0'))
            || extra > cap)
            return GECO_E_PAYLOAD;
    } else if (extra > GECO_REPLY_MAX_TEXT || memchr(p + ACK_BYTES, '\0', extra) != NULL) {
        return GECO_E_PAYLOAD;
    }

    if (stale(buf, now, max_skew_ns))
        return GECO_E_STALE;
    /* binds this reply to our request: one recorded for another request (a
       replay, or a confused server) does not answer this one */
    if (sodium_memcmp(p + 24, request_nonce, GECO_NONCE_BYTES) != 0)
        return GECO_E_NONCE;

    if (out != NULL) {
        out->job_id = load64(p);
        out->task_id = load64(p + 8);
        out->status = load32(p + 16);
        memcpy(out->request_nonce, p + 24, GECO_NONCE_BYTES);
    }
    if (want == GECO_STARTER_REPLY) {
        memcpy(text, p + ACK_BYTES, extra);
        *text_len = extra;
    } else if (text != NULL && cap > 0) {
        size_t keep = extra < cap - 1 ? extra : cap - 1;
        memcpy(text, p + ACK_BYTES, keep);
        text[keep] = '\0';
    }
    return 0;
}

int geco_decode_ack(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                    const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now,
                    int64_t max_skew_ns, geco_ack_t *out)
{
    return decode_reply(buf, len, key, request_nonce, now, max_skew_ns, GECO_ACK, 0, out, NULL,
                        0, NULL);
}

int geco_decode_adopt_reply(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                            const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now,
                            int64_t max_skew_ns, int peercred, geco_ack_t *out, char *text,
                            size_t cap)
{
    return decode_reply(buf, len, key, request_nonce, now, max_skew_ns, GECO_ADOPT_REPLY,
                        peercred ? GECO_PEERCRED : 0, out, text, cap, NULL);
}

int geco_decode_starter_reply(const uint8_t *buf, size_t len,
                              const uint8_t request_nonce[GECO_NONCE_BYTES], int64_t now,
                              int64_t max_skew_ns, geco_ack_t *out, char *strings, size_t cap,
                              size_t *strings_len)
{
    static const uint8_t public_key[GECO_KEY_BYTES];
    *strings_len = 0;
    return decode_reply(buf, len, public_key, request_nonce, now, max_skew_ns,
                        GECO_STARTER_REPLY, GECO_PEERCRED, out, strings, cap, strings_len);
}

int geco_decode_job_started(const uint8_t *buf, size_t len, const uint8_t key[GECO_KEY_BYTES],
                            int64_t now, int64_t max_skew_ns, geco_job_started_t *out)
{
    uint32_t n;
    int rc = check_frame(buf, len, key, 0, &n);
    if (rc != 0)
        return rc;
    if (buf[OFF_TYPE] != GECO_JOB_STARTED)
        return GECO_E_TYPE;
    const uint8_t *p = buf + GECO_HEADER_BYTES;
    if (n != GECO_JOB_STARTED_BYTES || load32(p + 20) != 0)
        return GECO_E_PAYLOAD;
    if (stale(buf, now, max_skew_ns))
        return GECO_E_STALE;
    out->job_id = load64(p);
    out->task_id = load64(p + 8);
    out->pid = load32(p + 16);
    return 0;
}

const uint8_t *geco_frame_nonce(const uint8_t *frame)
{
    return frame + OFF_NONCE;
}

int geco_check_header(const uint8_t *header)
{
    int rc = check_magic_version(header);
    return rc != 0 ? rc : geco_frame_length(header) < 0 ? GECO_E_LENGTH : 0;
}

long geco_frame_length(const uint8_t *header)
{
    uint32_t n = load32(header + OFF_LENGTH);
    return n > GECO_MAX_PAYLOAD ? GECO_E_LENGTH
                                : (long)(GECO_HEADER_BYTES + (size_t)n + GECO_MAC_BYTES);
}

const char *geco_strerror(int err)
{
    switch (err) {
    case 0:
        return "ok";
    case GECO_E_SHORT:
        return "frame too short (or buffer too small)";
    case GECO_E_MAGIC:
        return "not a geco frame (bad magic)";
    case GECO_E_VERSION:
        return "unsupported protocol version: gecod speaks protocol 1; upgrade the preload/gecod";
    case GECO_E_FLAGS:
        return "nonzero flags";
    case GECO_E_LENGTH:
        return "payload length over 4096 or not matching the frame size";
    case GECO_E_MAC:
        return "MAC mismatch (forged, corrupted, or another key)";
    case GECO_E_TYPE:
        return "unexpected message type";
    case GECO_E_PAYLOAD:
        return "malformed payload";
    case GECO_E_STALE:
        return "timestamp outside the allowed clock skew";
    case GECO_E_NONCE:
        return "ack does not answer this request (nonce mismatch)";
    default:
        return "unknown geco protocol error";
    }
}
