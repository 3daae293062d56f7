/*
 * preload.h - what the exec() preload's files share (not installed: the library
 * exports only its wrappers, exports.map).
 *
 *   geco_preload.c   geco_gate(): every wrapped exec asks it first; start reading there
 *   wrappers.c       the exported exec, spawn, popen and system wrappers
 *   real.c           the real functions they call through to
 *   setup.c          the constructor: which program loaded us, config, key
 *   emit.c           messages to the configured destination
 *   shepherd.c       sge_execd's gate: a shepherd's exec waits for gecod's ack
 *   shepherd_env.c   a shepherd's environment, this library taken out of LD_PRELOAD
 *   session.c        sshd's gate: an ssh session's process asks gecod to place it
 *   session_policy.c what runs when gecod does not place a session's process
 *
 * Everything here is hidden (-fvisibility=hidden): no symbol of ours can shadow one of
 * the host program's.
 */
#ifndef GECO_PRELOAD_H
#define GECO_PRELOAD_H

#include <limits.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "geco_config.h"
#include "geco_log.h"

/* ------------------------------------------------------------------------- */
/* state: written once under pthread_once (setup.c), read-only afterwards     */
/* ------------------------------------------------------------------------- */

extern geco_config_t cfg; /* geco_config.c fills it */

struct preload_state {
    int active;             /* 1: quarantine matching execs; 0: inert, pass through */
    int sshd;               /* 1: loaded into sshd or sshd-session (session.c) */
    char inert_reason[512]; /* why inert: said at a matching exec */
    char self_name[NAME_MAX + 1]; /* this library's file name (setup.c, find_self_name()) */
};
extern struct preload_state state;

/* The environment of an exec that changes it: an ssh session's (its job's variables
   added, session_env()) or a shepherd's (this library taken out of LD_PRELOAD,
   shepherd_env()). One array for both: they never meet in one process (sshd has no
   exec_filter). Static, as nothing may be allocated between fork and exec; each child
   has its own copy (Grid Engine's execds fork(), never vfork(), before they exec). */
#define EXEC_ENV_SLOTS 2048
extern char *exec_env[EXEC_ENV_SLOTS];

/* geco_preload.c: every wrapped exec (and, for ssh sessions, spawn) asks this first;
   0: call the real function (with *use_envp when it was changed), -1: do not */
int geco_gate(const char *path, char *const *envp, char *const **use_envp);
/* setup.c: resolve the real functions, read config and key, once (pthread_once) */
void preload_setup(void);
/* real.c: dlsym(RTLD_NEXT) every real function (setup.c calls it first) */
void resolve_real(void);

/* the real functions' signatures, one typedef each */
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
typedef FILE *(*popen_fn)(const char *, const char *);
typedef int (*system_fn)(const char *);

/* real.c: the real functions, one pointer each (resolve_real() fills them) */
extern execve_fn real_execve;
extern execv_fn real_execv;
extern execv_fn real_execvp;
extern execve_fn real_execvpe;
extern fexecve_fn real_fexecve;
extern spawn_fn real_posix_spawn;
extern spawn_fn real_posix_spawnp;
extern popen_fn real_popen;
extern system_fn real_system;

/* emit.c: write one message to the configured destination. severity: 3 error, 4 warning. */
void emit(int severity, const char *text, size_t len);
/* emit.c: "<name> (pid <pid>[, job <job>.<task>])" */
void put_job(line_t *l, const char *name, uint64_t job, uint64_t task, uint32_t pid);

/* shepherd.c: ask gecod to quarantine this process before it execs `name`; 0: go on,
   -1: refused (errno set) */
int quarantine(const char *name);
/* shepherd_env.c: *use_envp set to envp without this library in LD_PRELOAD when envp
   lists it, else left alone */
void shepherd_env(const char *name, char *const *envp, char *const **use_envp);

/* session.c: ask gecod once per process; 0: go on (*use_envp set when the environment
   changes), -1: refused (errno EACCES) */
int session_gate(char *const *envp, char *const **use_envp);
/* session_policy.c: gecod did not place this session's process; 1: it runs, 0: refused.
   Appends the rule that decided to l. */
int unplaced_may_run(line_t *l);

#endif /* GECO_PRELOAD_H */
