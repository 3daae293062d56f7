/*
 * real.c - the real exec, spawn, popen and system functions the wrappers (wrappers.c)
 * call through to: found once with dlsym(RTLD_NEXT), by the constructor (setup.c).
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>

#include "preload.h"

execve_fn real_execve;
execv_fn real_execv;
execv_fn real_execvp;
execve_fn real_execvpe;
fexecve_fn real_fexecve;
/* sshd's other ways to run a program (~/.ssh/rc, /etc/ssh/sshrc and xauth go through
   popen): wrapped for ssh sessions only */
spawn_fn real_posix_spawn;
spawn_fn real_posix_spawnp;
popen_fn real_popen;
system_fn real_system;

void resolve_real(void)
{
    real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    real_execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    real_execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
    real_execvpe = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
    real_fexecve = (fexecve_fn)dlsym(RTLD_NEXT, "fexecve");
    real_posix_spawn = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    real_posix_spawnp = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
    real_popen = (popen_fn)dlsym(RTLD_NEXT, "popen");
    real_system = (system_fn)dlsym(RTLD_NEXT, "system");
}
