#!/usr/bin/env bash
# make test-fresh: the README's commands on a minimal Debian, as a new user would run them.
# Per suite (SUITES, default "bookworm trixie"): a debootstrapped minbase root with only make,
# ca-certificates and Debian's python3 (build/fresh/<suite>.base, made once), copied fresh to
# build/fresh/<suite>, a clean clone of HEAD in /root/hvd_mnist, then in a chroot with an
# empty environment: `make train NP=2 TRAIN_FLAGS=--recipe=fast` and `make test TESTS=...`.
# Every output line with the seconds since the suite began: build/fresh/<suite>.log.
# Needs root and debootstrap; the network to Debian's archive and PyPI. Not reproduced by a
# chroot: the kernel, cgroups and limits, and a desktop user's environment (reports/fresh_machines.md).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITES=${SUITES:-bookworm trixie}
NP=${NP:-2}
TRAIN_FLAGS=${TRAIN_FLAGS:---recipe=fast}
TESTS=${TESTS:-tests/test_parity.py tests/test_faults.py}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
FRESH=$ROOT/build/fresh
# The environment a root login on a fresh Debian has, and nothing of this machine's.
CHROOT_ENV=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
            HOME=/root LANG=C.UTF-8 TERM=dumb)

if [ "$(id -u)" != 0 ]; then
  echo "test-fresh: needs root (debootstrap, chroot, mounts)" >&2; exit 1
fi
command -v debootstrap >/dev/null || {
  echo "test-fresh: needs debootstrap; as root run: apt-get install debootstrap" >&2; exit 1
}

mounts=()
unmount_all() {  # in the reverse order of mounting
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}"; done
  mounts=()
}

# Prints each line of a command's output with the seconds since the suite began.
timed() {
  local line
  "$@" 2>&1 | while IFS= read -r line; do printf '[%5d s] %s\n' $((SECONDS - suite_start)) "$line"; done
  return "${PIPESTATUS[0]}"
}

in_chroot() {  # a login shell's command line, inside the fresh root
  chroot "$dir" "${CHROOT_ENV[@]}" bash -c "$1"
}

run_suite() {
  local suite=$1 base=$FRESH/$1.base dir=$FRESH/$1 commit rc
  suite_start=$SECONDS
  trap unmount_all EXIT  # run_suite runs in the subshell of a pipeline, which has no traps
  commit=$(git -C "$ROOT" rev-parse HEAD)
  echo "== $suite, commit $commit, $(date -u '+%F %T') UTC"
  echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores;" \
       "avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no);" \
       "avx512_bf16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ ! -e "$base/.hvd_mnist-base-done" ]; then
    rm -rf "$base"
    timed debootstrap --variant=minbase --include=make,ca-certificates,python3 \
      "$suite" "$base" "$MIRROR" | tail -n 3
    touch "$base/.hvd_mnist-base-done"
  fi
  rm -rf "$dir"
  cp -a "$base" "$dir"
  rm "$dir/.hvd_mnist-base-done"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n::1 localhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$dir/etc/hosts"
  cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
  # This network reaches PyPI through a TLS proxy whose CA the host trusts locally; a
  # machine on an open network would not need it.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    chroot "$dir" update-ca-certificates >/dev/null
  fi
  git clone -q "$ROOT" "$dir/root/hvd_mnist"
  git -C "$dir/root/hvd_mnist" checkout -q "$commit"
  mount -t proc proc "$dir/proc"; mounts+=("$dir/proc")
  mount -t sysfs sys "$dir/sys"; mounts+=("$dir/sys")
  mount --rbind /dev "$dir/dev"; mount --make-rslave "$dir/dev"; mounts+=("$dir/dev")
  echo "os: $(. "$dir/etc/os-release" && echo "$PRETTY_NAME"), $(cat "$dir/etc/debian_version");" \
       "python3: $(in_chroot 'python3 --version' 2>&1)"

  echo "-- make train NP=$NP TRAIN_FLAGS=$TRAIN_FLAGS"
  rc=0
  timed in_chroot "cd /root/hvd_mnist && make train NP=$NP TRAIN_FLAGS=$TRAIN_FLAGS" || rc=$?
  echo "-- make train exit status $rc, $((SECONDS - suite_start)) s since start"
  echo "-- make test TESTS=\"$TESTS\""
  rc=0
  timed in_chroot "cd /root/hvd_mnist && make test TESTS='$TESTS'" || rc=$?
  echo "-- make test exit status $rc, $((SECONDS - suite_start)) s since start"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  unmount_all
}

mkdir -p "$FRESH"
for suite in $SUITES; do
  run_suite "$suite" 2>&1 | tee "$FRESH/$suite.log"
done
