#!/usr/bin/env bash
# run-in-vm.sh - run a command as root inside a throw-away Debian bookworm VM
# that boots systemd as PID 1 on a pure cgroup v2 (unified) hierarchy: the
# modern node geco's VM tests run on (integration/vm/README.md).
#
# Usage:
#   run-in-vm.sh DIR CMD [ARG...]   boot VM, share DIR at $VM_MOUNT (default
#                                   /mnt/host, also the working directory),
#                                   run CMD as root, stream its stdout/stderr,
#                                   power off, exit with CMD's exit status.
#                                   One CMD word is run with `bash -c WORD`
#                                   (shell syntax allowed); several words are
#                                   run as an argv (each word quoted).
#   run-in-vm.sh --build            only build/refresh the cached image
#   run-in-vm.sh --shell [DIR]      interactive boot, root autologin on the
#                                   serial console (exit with Ctrl-a x)
#   run-in-vm.sh --help
#
# Exit status: CMD's status; 124 if VM_TIMEOUT expired; 125 if the VM did
# not produce a result (boot failure, kernel panic, ...; the tail of the
# serial console log is printed to stderr); 126 usage / setup errors.
#
# Environment (all optional):
#   VM_CACHE     image cache dir                  [/var/cache/geco-vm]
#   VM_MOUNT     mount point of DIR in the guest  [/mnt/host]
#   VM_CPUS      vCPUs                            [nproc of host, max 4]
#   VM_MEM       guest RAM in MiB                 [2048]
#   VM_TIMEOUT   wall-clock limit per run, s      [3600]
#   VM_ACCEL     auto | kvm | tcg                 [auto]
#   VM_NET       user | none (user = slirp NAT, guest gets DHCP)  [user]
#   VM_SSH_PORT  if set, forward 127.0.0.1:PORT on the host to guest :22
#   VM_VERBOSE   1 = print accel and timings (boot, command, poweroff, qemu's CPU
#                seconds) to stderr, 2 = also copy the serial console  [0]
#   VM_KEEP      1 = keep the per-run work dir (console log, overlay)  [0]
#   VM_EXTRA_PACKAGES  extra Debian packages baked into the image
#   VM_PRESEED   debconf selections (debconf-set-selections lines) applied in
#                the image before VM_EXTRA_PACKAGES are installed
#   VM_MASK      units masked in the image (services of the packages that the
#                command starts its own way), e.g. "gridengine-exec.service"
#   VM_PREPARE   a command run as root in the image's chroot at build time, after
#                the packages and the guest's own configuration, with the guest's
#                host name and the address slirp gives it (private UTS and network
#                namespaces): what every boot would set up the same way, done once
#                and natively (the guest's CPU is emulated). It must stop what it
#                starts. Its output is in the image's prepare.log
#   VM_PREPARE_FILES  files for it, paths relative to VM_PREPARE_ROOT (a host
#                directory), copied to the same paths under /tmp/runinvm-prepare in
#                the chroot (removed afterwards); their content is part of the image key
#   VM_MIRROR / VM_SECURITY_MIRROR / VM_SUITE  Debian mirror & suite
#   VM_DISK_SIZE size of the (sparse) guest root disk          [4G]
#   VM_AUTO_INSTALL 1 = apt-get install missing host tools     [1]
#   VM_APT_CACHE the host's directory of downloaded packages, which the image build
#                takes every package it holds from (debootstrap checks each one's
#                checksum, apt in the chroot too) and adds what it downloads to
#                ("" = download everything)               [/var/cache/apt/archives]
#   VM_CA_DIR    extra CA certs (*.crt) to trust in the guest, e.g. for a
#                TLS-intercepting egress proxy  [/usr/local/share/ca-certificates]
#   VM_9P_CACHE  9p cache mode of the shared DIR: mmap (coherent, slow for
#                many small files) or loose (guest page cache, much faster;
#                host-side changes made while the VM runs may not be seen) [mmap]
#   VM_APPEND    extra guest kernel command line words
#   VM_QEMU_ARGS extra qemu arguments (word-split)
#   VM_CPU_MODEL qemu -cpu model                  [host with kvm, qemu64 with tcg]
#
# Needs root on the host (debootstrap, chroot, 9p passthrough).
set -euo pipefail

# --------------------------------------------------------------- settings --
IMAGE_RECIPE_VERSION=8   # bump when the image recipe below changes
VM_CACHE=${VM_CACHE:-/var/cache/geco-vm}
VM_MOUNT=${VM_MOUNT:-/mnt/host}
_ncpu=$(nproc 2>/dev/null || echo 2); (( _ncpu > 4 )) && _ncpu=4
VM_CPUS=${VM_CPUS:-$_ncpu}
VM_MEM=${VM_MEM:-2048}
VM_TIMEOUT=${VM_TIMEOUT:-3600}
VM_ACCEL=${VM_ACCEL:-auto}
VM_NET=${VM_NET:-user}
VM_SSH_PORT=${VM_SSH_PORT:-}
VM_VERBOSE=${VM_VERBOSE:-0}
VM_KEEP=${VM_KEEP:-0}
VM_EXTRA_PACKAGES=${VM_EXTRA_PACKAGES:-}
VM_PRESEED=${VM_PRESEED:-}
VM_MASK=${VM_MASK:-}
VM_PREPARE=${VM_PREPARE:-}
VM_PREPARE_FILES=${VM_PREPARE_FILES:-}
VM_PREPARE_ROOT=${VM_PREPARE_ROOT:-.}
VM_SUITE=${VM_SUITE:-bookworm}
VM_MIRROR=${VM_MIRROR:-http://deb.debian.org/debian}
VM_SECURITY_MIRROR=${VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
VM_DISK_SIZE=${VM_DISK_SIZE:-4G}
VM_AUTO_INSTALL=${VM_AUTO_INSTALL:-1}
VM_APT_CACHE=${VM_APT_CACHE-/var/cache/apt/archives}
VM_CA_DIR=${VM_CA_DIR-/usr/local/share/ca-certificates}
VM_9P_CACHE=${VM_9P_CACHE:-mmap}
VM_APPEND=${VM_APPEND:-}
VM_QEMU_ARGS=${VM_QEMU_ARGS:-}
VM_CPU_MODEL=${VM_CPU_MODEL:-}

BASE_PACKAGES="systemd,systemd-sysv,udev,kmod,dbus,libpam-systemd,python3,python3-venv,openssh-server,iproute2,procps"
IMG_DIR=""   # $VM_CACHE/image-<key>, set by ensure_image
GUEST_NAME=runinvm
GUEST_ADDR=10.0.2.15   # slirp's first DHCP lease (VM_NET=user)

log()  { printf 'run-in-vm: %s\n' "$*" >&2; }
die()  { log "ERROR: $*"; exit 126; }
now()  { date +%s.%N; }
dt()   { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# ------------------------------------------------------------ host tools --
ensure_host_tools() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    command -v qemu-img >/dev/null          || missing+=(qemu-utils)
    command -v debootstrap >/dev/null       || missing+=(debootstrap)
    command -v mkfs.ext4 >/dev/null         || missing+=(e2fsprogs)
    command -v flock >/dev/null             || missing+=(util-linux)
    [[ -z $VM_PREPARE ]] || command -v ip >/dev/null || missing+=(iproute2)
    if ((${#missing[@]})); then
        [[ $VM_AUTO_INSTALL == 1 ]] || die "missing host packages: ${missing[*]}"
        log "installing host packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 || true
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
            || die "apt-get install ${missing[*]} failed"
    fi
}

# ------------------------------------------------------------ image build --
ca_files() {
    [[ -n $VM_CA_DIR && -d $VM_CA_DIR ]] || return 0
    find "$VM_CA_DIR" -maxdepth 1 -type f -name '*.crt' | LC_ALL=C sort
}

image_key() {
    {
        printf '%s|%s|%s|%s|%s|%s|%s\n' "$IMAGE_RECIPE_VERSION" "$VM_SUITE" "$VM_MIRROR" \
            "$VM_SECURITY_MIRROR" "$BASE_PACKAGES" "$VM_EXTRA_PACKAGES" "$VM_DISK_SIZE"
        printf '%s\n' "$VM_PRESEED" "$VM_MASK" "$VM_PREPARE"
        ca_files | while read -r f; do cat "$f"; done
        local f
        for f in $VM_PREPARE_FILES; do printf '%s\n' "$f"; cat "$VM_PREPARE_ROOT/$f"; done
    } | sha256sum | cut -c1-16
}

image_ok() {
    [[ -f $IMG_DIR/stamp && -f $IMG_DIR/rootfs.img && -f $IMG_DIR/vmlinuz && -f $IMG_DIR/initrd.img ]]
}

BUILD_ROOT=""
mount_chroot() {
    mount -t proc proc "$BUILD_ROOT/proc"
    mount -t sysfs sysfs "$BUILD_ROOT/sys"
    mount --bind /dev "$BUILD_ROOT/dev"
    mount -t devpts devpts "$BUILD_ROOT/dev/pts" || true
}
umount_chroot() {
    [[ -n $BUILD_ROOT ]] || return 0
    local m
    for m in var/cache/apt/archives dev/pts dev sys proc; do
        if mountpoint -q "$BUILD_ROOT/$m" 2>/dev/null; then umount "$BUILD_ROOT/$m" || umount -l "$BUILD_ROOT/$m"; fi
    done
}

# everything that goes into the guest is written here
configure_rootfs() {
    local r=$1
    echo "$GUEST_NAME" > "$r/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost ip6-localhost ip6-loopback\n' "$GUEST_NAME" > "$r/etc/hosts"
    printf '/dev/vda / ext4 rw,noatime,errors=remount-ro 0 1\n' > "$r/etc/fstab"
    printf 'nameserver 10.0.2.3\n' > "$r/etc/resolv.conf"
    chroot "$r" passwd -d root >/dev/null
    # trust the host's extra CAs (e.g. a TLS-intercepting egress proxy)
    local f
    while read -r f; do
        [[ -n $f ]] && cp "$f" "$r/usr/local/share/ca-certificates/"
    done < <(ca_files)
    chroot "$r" update-ca-certificates >/dev/null 2>&1 || true
    chroot "$r" systemd-machine-id-setup >/dev/null 2>&1 || true

    # network: DHCP on any NIC through systemd-networkd (slirp when VM_NET=user)
    mkdir -p "$r/etc/systemd/network"
    printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
        > "$r/etc/systemd/network/20-wired.network"
    chroot "$r" systemctl enable systemd-networkd.service >/dev/null 2>&1
    chroot "$r" systemctl disable systemd-networkd-wait-online.service >/dev/null 2>&1 || true
    # things that only cost boot time in a throw-away VM
    chroot "$r" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
        e2scrub_reap.service fstrim.timer man-db.timer >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    [[ -z $VM_MASK ]] || chroot "$r" systemctl mask $VM_MASK >/dev/null 2>&1

    # the TCG "max" CPU advertises SVM/VMX; loading kvm_amd etc. only costs time
    printf 'blacklist %s\n' kvm kvm_amd kvm_intel powernow_k8 > "$r/etc/modprobe.d/runinvm-blacklist.conf"

    # root autologin on the serial console (only used by --shell)
    mkdir -p "$r/etc/systemd/system/serial-getty@ttyS0.service.d"
    cat > "$r/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 - $TERM
EOF

    # the guest half of run-in-vm
    cat > "$r/usr/local/sbin/runinvm-guest" <<'EOF'
#!/bin/bash
# Started by runinvm.service when the kernel command line has runvm_mode=run|shell.
# Mounts the control share (tag vmctl) and the user share (tag hostshare),
# waits for the boot to finish, runs /run/runinvm/cmd.sh, stores its exit
# status and powers the VM off.
mode=$(sed -n 's/.*runvm_mode=\([a-z]*\).*/\1/p' /proc/cmdline)
ctl=/run/runinvm
opts=trans=virtio,version=9p2000.L,msize=524288
say() { echo "runinvm: $*" > /dev/ttyS0; }
bail() { say "$*"; sync; systemctl poweroff --force --force; exit 1; }
modprobe -q -a 9pnet_virtio 9p
mkdir -p "$ctl"
mount -t 9p -o "$opts" vmctl "$ctl" || bail "cannot mount control share"
. "$ctl/env"
mkdir -p "$RUNINVM_MOUNT"
if [ -n "$RUNINVM_SHARE" ]; then
    mount -t 9p -o "$opts,cache=$RUNINVM_9P_CACHE" hostshare "$RUNINVM_MOUNT" || bail "cannot mount shared dir"
fi
state=$(systemctl is-system-running --wait 2>&1)
echo "$state" > "$ctl/boot-state"
[ "$mode" = run ] || exit 0
cd "$RUNINVM_MOUNT" || bail "cannot cd $RUNINVM_MOUNT"
env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUNINVM=1 RUNINVM_MOUNT="$RUNINVM_MOUNT" RUNINVM_BOOT_STATE="$state" \
    /bin/bash "$ctl/cmd.sh" > "$ctl/stdout" 2> "$ctl/stderr" < /dev/null
echo $? > "$ctl/rc.tmp"
mv "$ctl/rc.tmp" "$ctl/rc"
sync
# at once: the results are on the control share, the disk is a throw-away overlay, and
# an orderly stop only waits for the command's daemons (up to 90 s each)
systemctl poweroff --force --force
EOF
    chmod 755 "$r/usr/local/sbin/runinvm-guest"
    cat > "$r/etc/systemd/system/runinvm.service" <<'EOF'
[Unit]
Description=run-in-vm: run the command handed in by the host
ConditionKernelCommandLine=runvm_mode
After=multi-user.target

[Service]
Type=simple
ExecStart=/usr/local/sbin/runinvm-guest
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
    chroot "$r" systemctl enable runinvm.service >/dev/null 2>&1
}

# VM_PREPARE in the chroot, as if on the guest: its host name, and its address on a NIC
# (a veth pair: the host may have no dummy driver) in a network namespace of its own
prepare_rootfs() {
    local r=$1 log=$2 f
    [[ -n $VM_PREPARE ]] || return 0
    mkdir -p "$r/tmp/runinvm-prepare"
    for f in $VM_PREPARE_FILES; do
        install -D "$VM_PREPARE_ROOT/$f" "$r/tmp/runinvm-prepare/$f"
    done
    mount_chroot
    local rc=0
    unshare --uts --net --fork /bin/bash -c '
        set -e
        hostname "$2"; ip link set lo up
        ip link add eth0 type veth peer name eth1
        ip addr add "$3/24" dev eth0; ip link set eth1 up; ip link set eth0 up
        exec chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
            HOME=/root /bin/bash -c "$4"' _ "$r" "$GUEST_NAME" "$GUEST_ADDR" "$VM_PREPARE" \
        > "$log" 2>&1 || rc=$?
    # nothing it started may outlive it (the build directory is removed next)
    local p
    for p in /proc/[0-9]*; do
        if [[ $(readlink "$p/root" 2>/dev/null) == "$r" ]]; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
    done
    umount_chroot
    rm -rf "$r/tmp/runinvm-prepare"
    ((rc == 0)) || { tail -30 "$log" >&2; die "VM_PREPARE failed ($rc)"; }
}

prune_rootfs() {
    local r=$1 k m
    rm -rf "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* \
           "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/locale/* "$r"/usr/share/info/*
    for k in "$r"/lib/modules/*; do
        m=$k/kernel
        rm -rf "$m"/sound "$m"/drivers/{gpu,media,infiniband,iio,staging,comedi,isdn,bluetooth,hwmon} \
               "$m"/drivers/net/{wireless,ethernet,can,usb} "$m"/net/{bluetooth,wireless,mac80211}
        chroot "$r" depmod -a "${k##*/}"
    done
}

build_image() {
    local t0 t1 t2 t3 key bdir
    key=$(image_key)
    bdir="$VM_CACHE/build.$$"
    rm -rf "$bdir"; mkdir -p "$bdir"
    BUILD_ROOT="$bdir/root"
    trap 'umount_chroot; rm -rf "$bdir"' EXIT
    log "building image $key in $bdir (debootstrap $VM_SUITE from $VM_MIRROR)"
    t0=$(now)
    # the host's packages: most of the guest's are the same versions as the execution
    # host's that scripts/install.sh installed (a fresh machine's image build downloaded
    # them all again: ~100 MB)
    local cache=()
    [[ -n $VM_APT_CACHE && -d $VM_APT_CACHE && -w $VM_APT_CACHE ]] || VM_APT_CACHE=""
    [[ -z $VM_APT_CACHE ]] || cache=(--cache-dir="$VM_APT_CACHE")
    debootstrap --variant=minbase "${cache[@]}" --include="$BASE_PACKAGES" "$VM_SUITE" "$BUILD_ROOT" "$VM_MIRROR" \
        > "$bdir/debootstrap.log" 2>&1 || { tail -30 "$bdir/debootstrap.log" >&2; die "debootstrap failed"; }
    t1=$(now)
    cat > "$BUILD_ROOT/etc/apt/sources.list" <<EOF
deb $VM_MIRROR $VM_SUITE main
deb $VM_MIRROR $VM_SUITE-updates main
deb $VM_SECURITY_MIRROR $VM_SUITE-security main
EOF
    # initramfs only needs to find a virtio-blk ext4 root
    mkdir -p "$BUILD_ROOT/etc/initramfs-tools/conf.d"
    echo 'MODULES=list' > "$BUILD_ROOT/etc/initramfs-tools/conf.d/runinvm.conf"
    printf '%s\n' virtio_pci virtio_blk ext4 crc32c_generic >> "$BUILD_ROOT/etc/initramfs-tools/modules"
    printf '#!/bin/sh\nexit 101\n' > "$BUILD_ROOT/usr/sbin/policy-rc.d"; chmod 755 "$BUILD_ROOT/usr/sbin/policy-rc.d"
    mount_chroot
    # apt in the chroot takes the host's packages too (and leaves them: no apt-get clean)
    [[ -z $VM_APT_CACHE ]] || mount --bind "$VM_APT_CACHE" "$BUILD_ROOT/var/cache/apt/archives"
    # answers for packages that would otherwise ask (or configure themselves for the
    # build host, whose name the guest does not have)
    printf '%s\n' "$VM_PRESEED" > "$BUILD_ROOT/tmp/preseed"
    # shellcheck disable=SC2086
    chroot "$BUILD_ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive /bin/sh -c "
        set -e
        debconf-set-selections /tmp/preseed && rm /tmp/preseed
        apt-get update -qq
        apt-get -y -qq -o Dpkg::Options::=--force-confold --no-install-recommends upgrade
        apt-get -y -qq -o Dpkg::Options::=--force-confold --no-install-recommends install linux-image-amd64 $VM_EXTRA_PACKAGES
        " > "$bdir/apt.log" 2>&1 || { umount_chroot; tail -30 "$bdir/apt.log" >&2; die "kernel/package install failed"; }
    umount_chroot
    rm -f "$BUILD_ROOT/usr/sbin/policy-rc.d"
    t2=$(now)
    configure_rootfs "$BUILD_ROOT"
    prepare_rootfs "$BUILD_ROOT" "$bdir/prepare.log"
    prune_rootfs "$BUILD_ROOT"
    mkdir -p "$bdir/image"
    cp -L "$BUILD_ROOT/vmlinuz" "$bdir/image/vmlinuz"
    cp -L "$BUILD_ROOT/initrd.img" "$bdir/image/initrd.img"
    # Uncompressed ELF vmlinux: qemu boots it through the PVH entry point,
    # skipping the BIOS real-mode path and the in-guest xz decompression
    # (~3 s faster under TCG). Uses the guest's python3, so no host python.
    if chroot "$BUILD_ROOT" python3 -c '
import lzma, sys
d = open("/vmlinuz", "rb").read()
i = d.find(b"\xfd7zXZ\x00")
k = lzma.LZMADecompressor().decompress(d[i:]) if i >= 0 else b""
assert k[:4] == b"\x7fELF"
sys.stdout.buffer.write(k)' > "$bdir/image/vmlinux" 2>/dev/null; then :; else rm -f "$bdir/image/vmlinux"; fi
    truncate -s "$VM_DISK_SIZE" "$bdir/image/rootfs.img"
    mkfs.ext4 -q -F -L runinvm-root -d "$BUILD_ROOT" "$bdir/image/rootfs.img" \
        || die "mkfs.ext4 -d failed"
    echo "$key" > "$bdir/image/stamp"
    t3=$(now)
    rm -rf "$IMG_DIR"
    mv "$bdir/image" "$IMG_DIR"
    # drop images of other recipes/settings that were not used for 7 days
    find "$VM_CACHE" -mindepth 2 -maxdepth 2 -path "$VM_CACHE/image-*/stamp" -mtime +7 -printf '%h\n' \
        | while read -r old; do rm -rf "$old"; done
    cp "$bdir"/*.log "$IMG_DIR/" 2>/dev/null || true
    rm -rf "$bdir"; trap - EXIT; BUILD_ROOT=""
    printf '%s s (debootstrap=%s s, kernel+packages=%s s, configure+prepare+mkfs=%s s), rootfs.img=%s allocated (%s apparent)\n' \
        "$(dt "$t0" "$t3")" "$(dt "$t0" "$t1")" "$(dt "$t1" "$t2")" "$(dt "$t2" "$t3")" \
        "$(du -h "$IMG_DIR/rootfs.img" | cut -f1)" "$VM_DISK_SIZE" > "$IMG_DIR/build-times.txt"
    log "image built: $(cat "$IMG_DIR/build-times.txt")"
}

ensure_image() {
    mkdir -p "$VM_CACHE"
    IMG_DIR="$VM_CACHE/image-$(image_key)"
    if ! image_ok; then
        exec 9> "$VM_CACHE/.lock"
        flock 9
        image_ok || build_image
        flock -u 9; exec 9>&-
    fi
    touch "$IMG_DIR/stamp"   # last-used time, for pruning
}

# ---------------------------------------------------------------- accel --
pick_accel() {
    case $VM_ACCEL in
    kvm|tcg) echo "$VM_ACCEL"; return ;;
    auto) ;;
    *) die "VM_ACCEL must be auto, kvm or tcg" ;;
    esac
    # A usable KVM needs /dev/kvm AND hardware virtualisation. Hosts that
    # expose /dev/kvm through PVM (kvm_pvm module, no vmx/svm) can only run
    # PVM-enlightened guest kernels; a stock Debian kernel crawls and then
    # dies with "KVM internal error ... emulation failure", so use TCG there.
    if [[ -r /dev/kvm && -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo \
        && [[ ! -d /sys/module/kvm_pvm ]]; then
        echo kvm
    else
        echo tcg
    fi
}

# ------------------------------------------------------------------ run --
QEMU_PID=""; TAIL_PIDS=(); WORK=""; SHARE=""
cleanup_run() {
    local p
    if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then kill "$QEMU_PID" 2>/dev/null || true; fi
    for p in "${TAIL_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ -n $WORK && $VM_KEEP != 1 ]]; then rm -rf "$WORK"; fi
    if [[ -n $WORK && $VM_KEEP == 1 ]]; then log "kept work dir $WORK"; fi
}

# boot_vm MODE DIR   (MODE = run | shell)
boot_vm() {
    local mode=$1 share=$2 accel append
    accel=$(pick_accel)
    local -a q=(qemu-system-x86_64 -name run-in-vm -machine pc -nodefaults -no-user-config
        -display none -no-reboot -smp "$VM_CPUS" -m "$VM_MEM")
    # TCG: qemu64 (x86-64's baseline), not max: with AVX2 and the rest advertised, glibc's
    # string and memory functions take paths TCG emulates slowly. Measured on a 2-core
    # host: boot 30 s against 34-36 s, Python-heavy commands ~20% shorter.
    if [[ $accel == kvm ]]; then q+=(-accel kvm -cpu "${VM_CPU_MODEL:-host}")
    else q+=(-accel "tcg,thread=multi" -cpu "${VM_CPU_MODEL:-qemu64}"); fi
    append="root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 panic=-1 runvm_mode=$mode"
    # TCG: the TSC is fine and much cheaper than the HPET the kernel would pick
    [[ $accel == tcg ]] && append+=" tsc=reliable"
    # run mode: nobody needs the root autologin shell on the console, nor a mail server
    # (exim4 comes with Grid Engine's mailx and sat on the boot's critical chain: ~5 s)
    [[ $mode == run ]] && append+=" systemd.mask=serial-getty@ttyS0.service systemd.mask=exim4.service"
    [[ -n $VM_APPEND ]] && append+=" $VM_APPEND"
    # shellcheck disable=SC2206
    [[ -n $VM_QEMU_ARGS ]] && q+=($VM_QEMU_ARGS)
    local kernel=$IMG_DIR/vmlinuz
    [[ -s $IMG_DIR/vmlinux ]] && kernel=$IMG_DIR/vmlinux
    q+=(-kernel "$kernel" -initrd "$IMG_DIR/initrd.img" -append "$append"
        -drive "file=$WORK/overlay.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap"
        -device virtio-rng-pci
        -fsdev "local,id=fsctl,path=$WORK/ctl,security_model=passthrough"
        -device "virtio-9p-pci,fsdev=fsctl,mount_tag=vmctl")
    if [[ -n $share ]]; then
        q+=(-fsdev "local,id=fsshare,path=$share,security_model=passthrough"
            -device "virtio-9p-pci,fsdev=fsshare,mount_tag=hostshare")
    fi
    if [[ $VM_NET == user ]]; then
        local nd="user,id=n0"
        [[ -n $VM_SSH_PORT ]] && nd+=",hostfwd=tcp:127.0.0.1:$VM_SSH_PORT-:22"
        q+=(-netdev "$nd" -device "virtio-net-pci,netdev=n0,romfile=")
    fi
    qemu-img create -q -f qcow2 -F raw -b "$IMG_DIR/rootfs.img" "$WORK/overlay.qcow2"
    {
        printf 'RUNINVM_MOUNT=%q\n' "$VM_MOUNT"
        printf 'RUNINVM_SHARE=%q\n' "$share"
        printf 'RUNINVM_9P_CACHE=%q\n' "$VM_9P_CACHE"
    } > "$WORK/ctl/env"
    if ((VM_VERBOSE >= 1)); then log "accel=$accel cpus=$VM_CPUS mem=${VM_MEM}M"; fi
    if [[ $mode == shell ]]; then
        "${q[@]}" -serial mon:stdio
        return
    fi
    q+=(-serial "file:$WORK/console.log")
    : > "$WORK/console.log"
    T_START=$(now)
    timeout -k 10 "$VM_TIMEOUT" "${q[@]}" > "$WORK/qemu.out" 2>&1 &
    QEMU_PID=$!
}

mtime() { stat -c %.9Y "$1" 2>/dev/null || echo ""; }
# CHILDREN_CPU = CPU seconds (user + system) of the children this shell has waited for
# (bash's times, its second line). Not through $(...): a subshell starts from zero.
children_cpu() {
    times > "$WORK/times"
    CHILDREN_CPU=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m")
                                   s += a[1] * 60 + a[2] }; printf "%.0f", s }' "$WORK/times")
}

# the image, and a work dir with its control dir; SHARE = DIR's real path ("" for none)
prepare() {
    local share=$1
    if [[ -n $share ]]; then
        [[ -d $share ]] || die "not a directory: $share"
        share=$(cd "$share" && pwd -P)
    fi
    ensure_image
    WORK=$(mktemp -d /tmp/run-in-vm.XXXXXX)
    trap cleanup_run EXIT
    mkdir "$WORK/ctl"
    SHARE=$share
}

run_cmd() {
    local share
    prepare "$1"; shift
    share=$SHARE
    if (($# == 1)); then
        printf '%s\n' "$1" > "$WORK/ctl/cmd.sh"
    else
        printf '%q ' "$@" > "$WORK/ctl/cmd.sh"; echo >> "$WORK/ctl/cmd.sh"
    fi
    : > "$WORK/ctl/stdout"; : > "$WORK/ctl/stderr"
    children_cpu; local cpu0=$CHILDREN_CPU
    boot_vm run "$share"
    tail -n +1 -F --pid="$QEMU_PID" "$WORK/ctl/stdout" 2>/dev/null & TAIL_PIDS+=($!)
    tail -n +1 -F --pid="$QEMU_PID" "$WORK/ctl/stderr" >&2 2>/dev/null & TAIL_PIDS+=($!)
    if ((VM_VERBOSE >= 2)); then
        tail -n +1 -F --pid="$QEMU_PID" "$WORK/console.log" >&2 2>/dev/null & TAIL_PIDS+=($!)
    fi
    # qemu does not exit on "KVM internal error" (it pauses the guest), so
    # watch its output and stop it instead of waiting for VM_TIMEOUT
    ( while kill -0 "$QEMU_PID" 2>/dev/null; do
          if grep -q 'KVM internal error' "$WORK/qemu.out" 2>/dev/null; then
              sleep 1; kill "$QEMU_PID" 2>/dev/null; exit 0
          fi
          sleep 2
      done ) & TAIL_PIDS+=($!)
    local watch_pid=$!
    local qrc=0
    wait "$QEMU_PID" || qrc=$?
    kill "$watch_pid" 2>/dev/null || true; wait "$watch_pid" 2>/dev/null || true
    local t_end; t_end=$(now)
    QEMU_PID=""
    local p; for p in "${TAIL_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    TAIL_PIDS=()
    local t_boot t_rc
    t_boot=$(mtime "$WORK/ctl/boot-state"); t_rc=$(mtime "$WORK/ctl/rc")
    children_cpu
    if ((VM_VERBOSE >= 1)) || [[ ! -f $WORK/ctl/rc ]]; then
        log "timings: boot(qemu start -> systemd '$(cat "$WORK/ctl/boot-state" 2>/dev/null || echo '?')')=$( [[ -n $t_boot ]] && dt "$T_START" "$t_boot" || echo '?')s" \
            "command=$( [[ -n $t_boot && -n $t_rc ]] && dt "$t_boot" "$t_rc" || echo '?')s" \
            "poweroff=$( [[ -n $t_rc ]] && dt "$t_rc" "$t_end" || echo '?')s total=$(dt "$T_START" "$t_end")s" \
            "qemu_cpu=$((CHILDREN_CPU - cpu0))s"
    fi
    if [[ -f $WORK/ctl/rc ]]; then
        return "$(cat "$WORK/ctl/rc")"
    fi
    if ((qrc == 124 || qrc == 137)); then
        log "timed out after ${VM_TIMEOUT}s (VM_TIMEOUT)"
        if [[ -s $WORK/qemu.out ]]; then log "qemu said:"; tail -n 20 "$WORK/qemu.out" >&2; fi
        log "last console lines:"; tail -n 40 "$WORK/console.log" >&2; return 124
    fi
    log "VM exited (qemu status $qrc) without a result"
    if [[ -s $WORK/qemu.out ]]; then log "qemu said:"; cat "$WORK/qemu.out" >&2; fi
    log "last console lines:"
    tail -n 60 "$WORK/console.log" >&2 || true
    return 125
}

shell_vm() {
    local share
    prepare "${1:-}"
    share=$SHARE
    log "booting; root autologin on the serial console, share at $VM_MOUNT; 'poweroff' or Ctrl-a x to leave"
    boot_vm shell "$share"
}

# ----------------------------------------------------------------- main --
trap 'exit 130' INT TERM HUP   # make sure the EXIT traps (cleanup) run
case ${1:-} in
    -h|--help) usage; exit 0 ;;
    "") usage >&2; exit 126 ;;
    --build) ensure_host_tools; ensure_image; cat "$IMG_DIR/build-times.txt" >&2; exit 0 ;;
    --shell) shift; ensure_host_tools; shell_vm "${1:-}"; exit 0 ;;
esac
(($# >= 2)) || { usage >&2; exit 126; }
ensure_host_tools
rc=0
run_cmd "$@" || rc=$?
exit "$rc"
