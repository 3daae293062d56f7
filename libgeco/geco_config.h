/*
 * geco_config.h - the preload's configuration: /etc/geco/preload.conf (rendered
 * by `geco preload-config`) and the quarantine key it names.
 *
 * Loaded once, in the library's constructor (geco_address_parse() may consult
 * NSS, see geco_client.h); read-only afterwards, so the exec path -- in
 * sge_execd's child between fork() and exec() -- only reads it.
 */
#ifndef GECO_CONFIG_H
#define GECO_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "geco_client.h"
#include "geco_log.h"
#include "geco_proto.h"

#define DEFAULT_CONF "/etc/geco/preload.conf"
#define DEFAULT_SOCKET "path:/run/geco/gecod.sock"
#define DEFAULT_SESSION_SOCKET "path:/run/geco/gecod.sock"
#define DEFAULT_KEY_FILE "/etc/geco/quarantine.key"
#define DEFAULT_FILTER "sge_shepherd"
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_MAX_SKEW_MS 30000
#define MAX_FILTERS 16
/* geco.toml's defaults: [cgroup] name "GECO", [ssh] bypass_file */
#define DEFAULT_JOB_CGROUPS "/GECO"
#define DEFAULT_SESSION_BYPASS "/etc/geco/ssh-bypass"
#define MAX_JOB_CGROUPS 4
#define JOB_CGROUP_MAX 255 /* bytes of one job_cgroups prefix */
#define MAX_SESSION_ADMINS 64

enum log_to { LOG_STDERR, LOG_SYSLOG, LOG_NONE };

/* What the preload in sshd does when gecod cannot place a session's process
   (session_policy=): its exec runs only for root, the admins and while the bypass file
   exists (refuse); also when the kernel shows the process in a job's cgroup, where PAM's
   helper put it (in-job); always, where it is (allow). */
enum session_policy { SESSION_REFUSE, SESSION_IN_JOB, SESSION_ALLOW };

typedef struct {
    int policy_allow;                        /* 1: run anyway when quarantine fails (policy=allow) */
    int log_to;                              /* enum log_to: where messages go (log=) */
    int timeout_ms;                          /* deadline of one quarantine request (timeout_ms=) */
    int64_t max_skew_ns;                     /* accepted clock skew of an ack (max_skew_ms=) */
    geco_address_t addr;                     /* gecod's address, resolved (socket=) */
    char socket_text[256];                   /* the same address as written, for messages */
    geco_address_t session_addr;             /* where an ssh session's process asks, as the
                                                user (session_socket=, everyone's socket) */
    char session_socket_text[256];
    int session_policy;                      /* enum session_policy (session_policy=) */
    /* geco's job cgroups as /proc/self/cgroup shows them: <prefix>/<job>.<task>, prefix
       without a trailing '/' (the root: "") (job_cgroups=, comma-separated) */
    unsigned njob_cgroups;
    char job_cgroups[MAX_JOB_CGROUPS][JOB_CGROUP_MAX + 1];
    /* [ssh] admins and admin_groups, resolved when the file was rendered
       (session_admin_uids=, session_admin_gids=; comma-separated, may be empty) */
    unsigned nadmin_uids, nadmin_gids;
    uint32_t admin_uids[MAX_SESSION_ADMINS];
    uint32_t admin_gids[MAX_SESSION_ADMINS];
    char session_bypass[PATH_MAX];           /* [ssh] bypass_file (session_bypass=) */
    /* where each job's mount namespace is pinned, <dir>/<job>.<task> (job_mntns=; "":
       no private /tmp on this node) */
    char job_mntns[PATH_MAX];
    unsigned nfilters;                       /* how many of filters[] are set */
    char filters[MAX_FILTERS][NAME_MAX + 1]; /* program basenames to quarantine (exec_filter=) */
    /* The key gets a page of its own: sodium_mlock() keeps it out of swap and out
       of core dumps (MADV_DONTDUMP), both of which act on whole pages. */
    union {
        uint8_t key[GECO_KEY_BYTES];         /* the 32-byte MAC key (from key_file=) */
        uint8_t page[4096];
    } secret __attribute__((aligned(4096)));
} geco_config_t;

/*
 * Fill *cfg with the defaults, then with the config file ($GECO_PRELOAD_CONF
 * for a process running with its own ids, else DEFAULT_CONF) and, with want_key,
 * the key it names (sshd's processes ask as the user, peer-credentialed: no key in
 * them). geco_proto_init() must have succeeded.
 * Returns 0 (loaded: quarantine matching execs), 1 (not usable, expectedly:
 * say so only at a matching exec) or -1 (not usable: say so at load); err
 * says why. `note` names ignored unknown keys even then: log it as a warning
 * before err.
 */
int geco_config_load(geco_config_t *cfg, int want_key, line_t *err, line_t *note);

#endif /* GECO_CONFIG_H */
