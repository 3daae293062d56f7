/*
 * geco_config.c - read preload.conf and the quarantine key (see geco_config.h).
 *
 * The file format: one `key=value` per line; `#` starts a comment at the
 * start of a line or after a blank; keys socket, key_file, timeout_ms,
 * max_skew_ms, policy, exec_filter and log, and for the preload in sshd
 * session_socket, session_policy, job_cgroups, session_admin_uids,
 * session_admin_gids and session_bypass, and job_mntns where jobs get a private /tmp
 * (geco/wire/preload_config.py renders it, and
 * validates each value as apply() below reads it). Runs once, in the
 * constructor: no fork() between here and the exec.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "geco_client.h"
#include "geco_config.h"
#include "geco_log.h"
#include "geco_proto.h"

#define CONF_MAX 4096

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static char *trim(char *s, char *end)
{
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    *end = '\0';
    return s;
}

/* The end of a refusal ("<key> must be ..., "): got '<value>'. Returns -1. */
static int got(line_t *err, const char *value)
{
    put(err, "got '");
    put(err, value);
    put(err, "'");
    return -1;
}

/* A key with n choices, names[] in the order of its enum: *field = value's index, or
   the refusal ("<key> must be a, b or c, ") and -1. */
static int set_choice(int *field, const char *value, const char *const names[], int n,
                      const char *refusal, line_t *err)
{
    for (int i = 0; i < n; i++)
        if (strcmp(value, names[i]) == 0) {
            *field = i;
            return 0;
        }
    put(err, refusal);
    return got(err, value);
}

static int set_filters(geco_config_t *cfg, char *value, line_t *err)
{
    cfg->nfilters = 0;
    char *p = value;
    for (;;) {
        char *comma = strchr(p, ',');
        char *end = comma != NULL ? comma : p + strlen(p);
        char *name = trim(p, end);
        size_t n = strlen(name);
        if (n == 0 || n > NAME_MAX || strchr(name, '/') != NULL) {
            put(err, "exec_filter must be comma-separated program basenames (no '/', "
                     "none empty), ");
            return got(err, name);
        }
        if (cfg->nfilters == MAX_FILTERS) {
            put(err, "exec_filter names more than 16 programs");
            return -1;
        }
        memcpy(cfg->filters[cfg->nfilters++], name, n + 1);
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

/* job_cgroups: 1 to MAX_JOB_CGROUPS absolute cgroup paths (each at most JOB_CGROUP_MAX
   bytes), comma-separated: where geco's <job>.<task> cgroups are, as /proc/self/cgroup
   shows them. A trailing '/' is dropped, so the root "/" is kept as "". */
static int set_job_cgroups(geco_config_t *cfg, const char *value, line_t *err)
{
    unsigned n = 0;
    const char *p = value;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || p[0] != '/' || len > JOB_CGROUP_MAX || n == MAX_JOB_CGROUPS) {
            put(err, "job_cgroups must be 1 to 4 comma-separated absolute cgroup paths of at "
                     "most 255 bytes, ");
            return got(err, value);
        }
        while (len > 0 && p[len - 1] == '/')
            len--;
        memcpy(cfg->job_cgroups[n], p, len);
        cfg->job_cgroups[n++][len] = '\0';
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    cfg->njob_cgroups = n;
    return 0;
}

/* session_admin_uids, session_admin_gids: up to MAX_SESSION_ADMINS ids in 0..2^32-2
   (decimal digits only), comma-separated; empty: none. */
static int set_ids(uint32_t *ids, unsigned *count, const char *key, const char *value,
                   line_t *err)
{
    unsigned n = 0;
    const char *p = value;
    while (*p != '\0') {
        const char *start = p;
        uint64_t v = 0;
        while (*p >= '0' && *p <= '9' && p - start < 10)
            v = v * 10 + (uint64_t)(*p++ - '0');
        if (p == start || (*p != ',' && *p != '\0') || v > UINT32_MAX - 1
            || n == MAX_SESSION_ADMINS || (*p == ',' && p[1] == '\0')) {
            put(err, key);
            put(err, " must be at most 64 comma-separated ids in 0..4294967294 (or nothing), ");
            return got(err, value);
        }
        ids[n++] = (uint32_t)v;
        if (*p == ',')
            p++;
    }
    *count = n;
    return 0;
}

/* One `key=value` setting. Returns 0, 1 (unknown key: ignored) or -1 (err filled). */
static int apply(geco_config_t *cfg, const char *key, char *value, char *key_file,
                 line_t *err)
{
    const char *why = NULL;
    long v;
    if (strcmp(key, "socket") == 0 || strcmp(key, "session_socket") == 0) {
        int session = key[1] == 'e';
        char *text = session ? cfg->session_socket_text : cfg->socket_text;
        if (strlen(value) >= sizeof cfg->socket_text
            || geco_address_parse(value, session ? &cfg->session_addr : &cfg->addr, &why) != 0) {
            put(err, key);
            put(err, " '");
            put(err, value);
            put(err, "': ");
            put(err, why != NULL ? why : "longer than 255 bytes");
            return -1;
        }
        memcpy(text, value, strlen(value) + 1);
    } else if (strcmp(key, "key_file") == 0) {
        if (value[0] != '/' || strlen(value) >= PATH_MAX) {
            put(err, "key_file must be an absolute path, ");
            return got(err, value);
        }
        memcpy(key_file, value, strlen(value) + 1);
    } else if (strcmp(key, "timeout_ms") == 0 || strcmp(key, "max_skew_ms") == 0) {
        v = geco_parse_count(value, 3600000);
        if (v < 0) {
            put(err, key);
            put(err, " must be a number of milliseconds in 1..3600000, ");
            return got(err, value);
        }
        if (key[0] == 't')
            cfg->timeout_ms = (int)v;
        else
            cfg->max_skew_ns = (int64_t)v * 1000000;
    } else if (strcmp(key, "policy") == 0) {
        static const char *const names[] = {"refuse", "allow"};
        return set_choice(&cfg->policy_allow, value, names, 2,
                          "policy must be refuse or allow, ", err);
    } else if (strcmp(key, "session_policy") == 0) {
        static const char *const names[] = {[SESSION_REFUSE] = "refuse",
                                            [SESSION_IN_JOB] = "in-job",
                                            [SESSION_ALLOW] = "allow"};
        return set_choice(&cfg->session_policy, value, names, 3,
                          "session_policy must be refuse, in-job or allow, ", err);
    } else if (strcmp(key, "job_cgroups") == 0) {
        return set_job_cgroups(cfg, value, err);
    } else if (strcmp(key, "session_admin_uids") == 0) {
        return set_ids(cfg->admin_uids, &cfg->nadmin_uids, key, value, err);
    } else if (strcmp(key, "session_admin_gids") == 0) {
        return set_ids(cfg->admin_gids, &cfg->nadmin_gids, key, value, err);
    } else if (strcmp(key, "session_bypass") == 0) {
        if (value[0] != '/' || strlen(value) >= sizeof cfg->session_bypass) {
            put(err, "session_bypass must be an absolute path, ");
            return got(err, value);
        }
        memcpy(cfg->session_bypass, value, strlen(value) + 1);
    } else if (strcmp(key, "job_mntns") == 0) {
        if (value[0] != '/' || strlen(value) >= sizeof cfg->job_mntns - 32) {
            put(err, "job_mntns must be an absolute path, ");
            return got(err, value);
        }
        memcpy(cfg->job_mntns, value, strlen(value) + 1);
    } else if (strcmp(key, "exec_filter") == 0) {
        return set_filters(cfg, value, err);
    } else if (strcmp(key, "log") == 0) {
        static const char *const names[] = {[LOG_STDERR] = "stderr", [LOG_SYSLOG] = "syslog",
                                            [LOG_NONE] = "none"};
        return set_choice(&cfg->log_to, value, names, 3, "log must be stderr, syslog or none, ",
                          err);
    } else {
        return 1;
    }
    return 0;
}

/* Parse the config text in place. Every line is applied even after an error,
   so that a `log=` line further down still decides where the error goes; a
   key given twice takes its last value. Unknown keys are ignored (a newer
   `geco preload-config` must not switch an older preload off) and named in
   `note`. Returns 0 or -1 (err names the first problem and its line). */
static int parse_config(geco_config_t *cfg, char *text, size_t len, char *key_file,
                        line_t *err, line_t *note)
{
    char *p = text, *end = text + len;
    unsigned lineno = 0, unknown = 0;
    int rc = 0;

    if (memchr(text, '\0', len) != NULL) {
        put(err, "it contains a NUL byte");
        return -1;
    }
    while (p < end) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL)
            eol = end;
        lineno++;
        /* `#` starts a comment at the start of a line or after a blank, so a
           socket path may still contain one */
        for (char *c = p; c < eol; c++) {
            if (*c == '#' && (c == p || is_space(c[-1]))) {
                eol = c;
                break;
            }
        }
        char *next = memchr(p, '\n', (size_t)(end - p));
        char *line = trim(p, eol);
        if (*line != '\0') {
            char *eq = strchr(line, '=');
            line_t discard = {NULL, 0, 0}; /* only the first error is reported */
            line_t *target = rc == 0 ? err : &discard;
            if (eq == NULL) {
                put(target, "line ");
                put_u64(target, lineno);
                put(target, ": expected key=value, got '");
                put(target, line);
                put(target, "'");
                rc = -1;
            } else {
                char *key = trim(line, eq);
                char *value = trim(eq + 1, eq + 1 + strlen(eq + 1));
                size_t before = target->len;
                put(target, "line ");
                put_u64(target, lineno);
                put(target, ": ");
                int r = apply(cfg, key, value, key_file, target);
                if (r < 0) {
                    rc = -1;
                } else {
                    target->len = before;
                    if (r > 0 && unknown++ == 0) {
                        put(note, "ignored unknown key '");
                        put(note, key);
                        put(note, "' on line ");
                        put_u64(note, lineno);
                    }
                }
            }
        }
        p = next == NULL ? end : next + 1;
    }
    if (unknown > 1) {
        put(note, " and ");
        put_u64(note, unknown - 1);
        put(note, " more unknown key(s)");
    }
    return rc;
}

/* Read a small file from fd into buf (at most cap bytes); returns the length or -1 (errno). */
static ssize_t read_small(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return (ssize_t)got;
        got += (size_t)n;
        if (got == cap)
            return (ssize_t)got;
    }
}

/* Read the 32-byte key; returns 0, 1 (unreadable for this unprivileged
   process: an expected situation, said only at a matching exec) or -1. */
static int load_key(geco_config_t *cfg, const char *path, line_t *err)
{
    struct stat st;
    char extra[GECO_KEY_BYTES + 1];
    int rc = -1, fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    ssize_t n;

    put(err, "key file ");
    put(err, path);
    if (fd < 0) {
        int e = errno;
        put(err, ": ");
        put_errno(err, e);
        if ((e == EACCES || e == EPERM) && geteuid() != 0) {
            put(err, " (the preload reads it as root: load it into sge_execd started by root)");
            rc = 1;
        } else if (e == ENOENT) {
            put(err, " (create it with: geco keygen)");
        }
        goto cleanup;
    }
    if (fstat(fd, &st) != 0) {
        put(err, ": ");
        put_errno(err, errno);
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 077) != 0) {
        put(err, " must be a regular file owned by root with mode 0600 or 0400, got uid ");
        put_u64(err, st.st_uid);
        put(err, " mode 0");
        char mode[4] = {(char)('0' + ((st.st_mode >> 6) & 7)), (char)('0' + ((st.st_mode >> 3) & 7)),
                        (char)('0' + (st.st_mode & 7)), '\0'};
        put(err, mode);
        put(err, " (fix: chown root:root ");
        put(err, path);
        put(err, "; chmod 600 ");
        put(err, path);
        put(err, ")");
        goto cleanup;
    }
    n = read_small(fd, extra, sizeof extra);
    if (n != GECO_KEY_BYTES) {
        put(err, " must hold exactly 32 bytes, got ");
        if (n < 0)
            put_errno(err, errno);
        else
            put_u64(err, (uint64_t)n == sizeof extra ? (uint64_t)st.st_size : (uint64_t)n);
        put(err, " (regenerate it: geco keygen --force, then restart gecod and sge_execd)");
        goto cleanup;
    }
    memcpy(cfg->secret.key, extra, GECO_KEY_BYTES);
    /* best effort: RLIMIT_MEMLOCK may forbid it */
    (void)sodium_mlock(cfg->secret.page, sizeof cfg->secret.page);
    err->len = 0;
    rc = 0;
cleanup:
    sodium_memzero(extra, sizeof extra);
    if (fd >= 0)
        close(fd);
    return rc;
}

int geco_config_load(geco_config_t *cfg, int want_key, line_t *err, line_t *note)
{
    static char text[CONF_MAX];
    static char key_file[PATH_MAX];
    const char *path = DEFAULT_CONF, *env, *why = NULL;
    struct stat st;
    int fd, r;
    ssize_t len;

    memcpy(cfg->socket_text, DEFAULT_SOCKET, sizeof DEFAULT_SOCKET);
    (void)geco_address_parse(DEFAULT_SOCKET, &cfg->addr, &why);
    memcpy(cfg->session_socket_text, DEFAULT_SESSION_SOCKET, sizeof DEFAULT_SESSION_SOCKET);
    (void)geco_address_parse(DEFAULT_SESSION_SOCKET, &cfg->session_addr, &why);
    /* the sshd preload's defaults are geco.toml's: [ssh] gecod_unreachable "decide-here",
       no admins, [cgroup] name "GECO", [ssh] bypass_file */
    cfg->session_policy = SESSION_IN_JOB;
    cfg->njob_cgroups = 1;
    memcpy(cfg->job_cgroups[0], DEFAULT_JOB_CGROUPS, sizeof DEFAULT_JOB_CGROUPS);
    cfg->nadmin_uids = cfg->nadmin_gids = 0;
    memcpy(cfg->session_bypass, DEFAULT_SESSION_BYPASS, sizeof DEFAULT_SESSION_BYPASS);
    memcpy(key_file, DEFAULT_KEY_FILE, sizeof DEFAULT_KEY_FILE);
    cfg->timeout_ms = DEFAULT_TIMEOUT_MS;
    cfg->max_skew_ns = (int64_t)DEFAULT_MAX_SKEW_MS * 1000000;
    cfg->log_to = LOG_STDERR;
    cfg->nfilters = 1;
    memcpy(cfg->filters[0], DEFAULT_FILTER, sizeof DEFAULT_FILTER);

    /* $GECO_PRELOAD_CONF (tests, an admin trying a config) only for a process
       running with its own ids: a setuid/setgid program must not let its
       caller choose where its exec policy comes from. */
    env = secure_getenv("GECO_PRELOAD_CONF");
    if (env != NULL && *env != '\0' && getuid() == geteuid() && getgid() == getegid())
        path = env;

    put(err, "config ");
    put(err, path);
    put(err, ": ");
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        put_errno(err, e);
        if (e == ENOENT) {
            /* not configured at all: nothing to say at load (every process
               that inherits LD_PRELOAD would repeat it); a matching exec says it */
            put(err, " (write it with: geco preload-config)");
            return 1;
        }
        return -1;
    }
    /* the policy decides whether jobs may run uncontained: only root may set it */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
        put(err, "must be a regular file owned by root and not writable by group or others");
        close(fd);
        return -1;
    }
    len = read_small(fd, text, sizeof text);
    close(fd);
    if (len < 0) {
        put_errno(err, errno);
        return -1;
    }
    if ((size_t)len == sizeof text) {
        put(err, "larger than 4095 bytes");
        return -1;
    }
    if (parse_config(cfg, text, (size_t)len, key_file, err, note) != 0) {
        note->len = 0; /* the error is what counts */
        return -1;
    }
    if (note->len > 0) {
        put(note, " (in ");
        put(note, path);
        put(note, ")");
    }
    err->len = 0;
    if (!want_key)
        return 0;
    r = load_key(cfg, key_file, err);
    return r > 0 ? 1 : r;
}
