# Makefile -- geco's C programs, each in the directory named for what it is, built into
# $(BUILD):
#
#   preload/  libgeco_preload.so  the exec() wrapper loaded into sge_execd and sshd
#   pam/      pam_geco.so         sshd's PAM module, its gate into jobs
#   hook/     geco_hook           the prolog, epilog and starter Grid Engine runs: ask gecod
#                                 to do the work, else run the Python hook
#   mntns/    geco_mntns          a job's private /tmp and /dev/shm: its mount namespace
#                                 made and dropped (gecod runs it)
#   bench/    geco_qbench         the quarantine benchmark's client (not installed)
#   libgeco/  libgeco.a           what they share: the wire format (geco_proto), the client
#                                 (geco_client), a job's identity (geco_job), the preload's
#                                 config (geco_config), message lines (geco_log), a job's
#                                 mount namespace entered (geco_mntns)
#   lane/     gecod's fast lane, a cffi extension of libgeco's wire format and job identity:
#             built by geco/_lane_build.py (setup.py, scripts/install.sh), not here
#
#   make [BUILD=dir]              all of the above (default build/c)
#   make install [DESTDIR=dir]    $(DESTDIR)/usr/lib/geco/libgeco_preload.so,
#                                 $(DESTDIR)/lib/<multiarch>/security/pam_geco.so,
#                                 $(DESTDIR)/usr/libexec/geco/{prolog,epilog,starter,geco-mntns}
#                                 (the Debian package's layout: debian/rules runs it)
#   make clean
#
# Needs gcc, libsodium-dev and libpam0g-dev (scripts/install.sh installs them). CFLAGS,
# CPPFLAGS and LDFLAGS from the environment are added (dpkg-buildflags' hardening).

CC      ?= cc
AR      ?= ar
# where the package puts them; the hook and the PAM module name LIBEXECDIR at build time
LIBDIR  ?= /usr/lib/geco
LIBEXECDIR ?= /usr/libexec/geco
MULTIARCH ?= $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || $(CC) -print-multiarch)
PAMDIR  ?= /lib/$(MULTIARCH)/security
BUILD   ?= build/c
OBJ     := $(BUILD)/obj

LIBGECO := $(BUILD)/libgeco.a
PRELOAD := $(BUILD)/libgeco_preload.so
PAM     := $(BUILD)/pam_geco.so
HOOK    := $(BUILD)/geco_hook
MNTNS   := $(BUILD)/geco_mntns
QBENCH  := $(BUILD)/geco_qbench

LIBGECO_OBJS := $(patsubst %.c,$(OBJ)/%.o,$(wildcard libgeco/*.c))
PRELOAD_OBJS := $(patsubst %.c,$(OBJ)/%.o,$(wildcard preload/*.c))
HDRS    := $(wildcard libgeco/*.h preload/*.h)

CFLAGS  ?= -O2 -g
# Every object is position-independent: libgeco.a goes into the two shared objects too.
# -fvisibility=hidden: only what a program marks for export leaves it (the preload's
#   exec wrappers, with exports.map; pam_geco's pam_sm_* entry points).
# -fno-delete-null-pointer-checks: glibc declares exec*()'s path nonnull, yet
#   execve(NULL, ...) must fail with EFAULT as without the preload, not crash
#   because the compiler dropped our NULL check.
override CFLAGS += -std=gnu11 -fPIC -Wall -Wextra -Werror -fvisibility=hidden \
                   -fno-delete-null-pointer-checks -pthread
override CPPFLAGS += -Ilibgeco
HARDEN  := -Wl,-z,relro -Wl,-z,now

.PHONY: all preload pam hook mntns qbench install clean

all: preload pam hook mntns qbench
preload: $(PRELOAD)
pam: $(PAM)
hook: $(HOOK)
mntns: $(MNTNS)
qbench: $(QBENCH)

$(OBJ)/%.o: %.c $(HDRS) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# where they find the Python hooks: fixed at build time, never from the job's environment
$(OBJ)/hook/geco_hook.o $(OBJ)/pam/pam_geco.o: CPPFLAGS += -DLIBEXEC='"$(LIBEXECDIR)"'

$(LIBGECO): $(LIBGECO_OBJS)
	rm -f $@
	$(AR) rcs $@ $^

# exports.map: only the exec wrappers leave the library
$(PRELOAD): $(PRELOAD_OBJS) $(LIBGECO) preload/exports.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,--version-script=preload/exports.map \
		-Wl,--no-undefined $(HARDEN) -o $@ $(PRELOAD_OBJS) $(LIBGECO) -lsodium -ldl -pthread

$(PAM): $(OBJ)/pam/pam_geco.o $(LIBGECO)
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,--no-undefined $(HARDEN) -o $@ $^ -lpam -lsodium

$(HOOK): $(OBJ)/hook/geco_hook.o $(LIBGECO)
	$(CC) $(CFLAGS) $(LDFLAGS) $(HARDEN) -o $@ $^ -lsodium

$(MNTNS): $(OBJ)/mntns/geco_mntns.o
	$(CC) $(CFLAGS) $(LDFLAGS) $(HARDEN) -o $@ $^

$(QBENCH): $(OBJ)/bench/geco_qbench.o $(LIBGECO)
	$(CC) $(CFLAGS) -o $@ $^ -lsodium

# install(1) replaces the file by a new inode: processes that have the old
# library mapped keep running with it.
install: $(PRELOAD) $(PAM) $(HOOK) $(MNTNS)
	install -D -m 0644 $(PRELOAD) $(DESTDIR)$(LIBDIR)/libgeco_preload.so
	install -D -m 0644 $(PAM) $(DESTDIR)$(PAMDIR)/pam_geco.so
	install -D -m 0755 $(HOOK) $(DESTDIR)$(LIBEXECDIR)/prolog
	install -D -m 0755 $(HOOK) $(DESTDIR)$(LIBEXECDIR)/epilog
	install -D -m 0755 $(HOOK) $(DESTDIR)$(LIBEXECDIR)/starter
	install -D -m 0755 $(MNTNS) $(DESTDIR)$(LIBEXECDIR)/geco-mntns

clean:
	rm -rf $(BUILD)
