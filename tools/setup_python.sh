#!/usr/bin/env bash
# The Python tools/setup.sh builds the venv with, the system packages the build needs
# (apt_install, which setup.sh also uses for the test bed's), and the venv itself. Sourced by tools/setup.sh (which sets TF, PINS, PYTHON, VENV).
# Run alone, `TF=2.21 VENV=DIR tools/setup_python.sh` does only these steps
# (tests/test_setup_python.py runs it against fake Pythons); with PINS=FILE FOR=WHAT, for
# another pins file (make torch-venv: tools/pins/torch.txt).
#
# Without PYTHON=, the pins file's "# pythons:" line is the preference order; each
# version is looked for as python3.X on PATH, then in pyenv's versions (PYENV_ROOT, or the
# root of the pyenv on PATH).

python_version_of() {  # X.Y.Z of a Python; fails when it does not run
  "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

# pyenv's versions are there whether or not a shim selects them. Only a pyenv this
# environment has counts: under `env -i PATH=/usr/bin:...` a ~/.pyenv is not looked in, so
# a shell without pyenv gets the Python on its PATH.
pyenv_root() {
  if [ -n "${PYENV_ROOT:-}" ]; then
    echo "$PYENV_ROOT"
  elif command -v pyenv >/dev/null; then
    pyenv root
  fi
}

find_python() {  # python$1 on PATH, else pyenv's newest $1.*
  local root candidate
  root=$(pyenv_root 2>/dev/null || true)
  while read -r candidate; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      local version
      version=$(python_version_of "$candidate") || continue
      if [ "${version%.*}" = "$1" ]; then echo "$candidate"; return 0; fi
    fi
  done < <(command -v "python$1" 2>/dev/null || true
           if [ -n "$root" ]; then
             printf '%s\n' "$root"/versions/"$1".*/bin/"python$1" | sort -r -V
           fi)
  return 1
}

install_hint() {  # what to install for a Python the pins allow, for this OS
  local version
  if command -v apt-cache >/dev/null; then
    for version in "${pythons[@]}"; do
      if apt-cache show "python$version" >/dev/null 2>&1; then
        echo "apt-get install python$version python$version-venv python$version-dev"
        return
      fi
    done
  fi
  echo "pyenv install ${pythons[0]}"
}

# Sets PYTHON and PYTHON_VERSION, or stops with one line; writes nothing. Its line
# "setup: Python X.Y.Z (path)" is the first setup prints. FOR names what the pins are for.
choose_python() {
  local FOR=${FOR:-TF $TF}
  read -r -a pythons < <(sed -n 's/^# pythons: //p' "$PINS")
  local origin=""
  if [ -z "$PYTHON" ] && venv_is_whole; then
    # A venv already made keeps its Python: another one would mean building it all again.
    PYTHON=$VENV/bin/python origin=", the existing venv's"
  elif [ -z "$PYTHON" ]; then
    local version
    for version in "${pythons[@]}"; do
      PYTHON=$(find_python "$version") && break
      PYTHON=
    done
    if [ -z "$PYTHON" ]; then
      echo "setup: no Python ${pythons[*]} on PATH or in pyenv for $FOR; install one" \
           "($(install_hint)) or pass PYTHON=/path/to/python3.X" >&2
      exit 1
    fi
  fi
  if [ ! -e "$PYTHON" ] && ! command -v "$PYTHON" >/dev/null; then
    echo "setup: PYTHON=$PYTHON: no such file; pass PYTHON=/path/to/python3.X with X one of" \
         "${pythons[*]}" >&2
    exit 1
  fi
  PYTHON_VERSION=$(python_version_of "$PYTHON") || {
    echo "setup: PYTHON=$PYTHON does not run; pass PYTHON=/path/to/python3.X with X one of" \
         "${pythons[*]}" >&2
    exit 1
  }
  if [[ " ${pythons[*]} " != *" ${PYTHON_VERSION%.*} "* ]]; then
    echo "setup: $FOR has no wheels for Python $PYTHON_VERSION ($PYTHON); pass" \
         "PYTHON=/path/to/python3.X with X one of ${pythons[*]}" >&2
    exit 1
  fi
  if [ -z "$origin" ] && venv_is_whole; then
    local venv_version
    venv_version=$(python_version_of "$VENV/bin/python")
    if [ "${venv_version%.*}" != "${PYTHON_VERSION%.*}" ]; then
      echo "setup: $VENV was made with Python $venv_version, not $PYTHON_VERSION; remove it" \
           "(rm -rf $VENV) or pass another VENV=" >&2
      exit 1
    fi
  fi
  echo "setup: Python $PYTHON_VERSION ($PYTHON$origin)"
}

missing_build_packages() {  # Debian packages the venv and the Horovod build need, not installed
  local missing=() python_minor=${PYTHON_VERSION%.*} package tool
  # Debian's own Python keeps ensurepip and the headers Horovod compiles against in
  # packages of their own; a Python built by pyenv has both.
  if command -v dpkg-query >/dev/null \
     && dpkg-query -S "$(readlink -f "$PYTHON")" >/dev/null 2>&1; then
    for package in "python$python_minor-venv" "python$python_minor-dev"; do
      [ "$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null)" = installed ] \
        || missing+=("$package")
    done
  fi
  for tool in gcc g++ cmake make patch; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  echo "${missing[*]}"
}

# apt_install required|optional PACKAGE...: as root with apt-get, `apt-get update` (once per
# run) and one install of the list, with one "setup: apt-get ... ok" line. Without root, a
# required list stops set-up with the one apt-get install line to run, an optional one is
# skipped, saying so (the tests that need it skip); a failed install likewise stops or is
# reported. The test bed starts its own sshd, munged and Slurm daemons inside namespaces, so
# policy-rc.d keeps the packages' own services from starting in the root namespace.
apt_updated=0
apt_install() {
  local need=$1; shift
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    if [ "$need" = optional ]; then
      echo "setup: not installing $* (needs root and apt-get); the tests that need them will skip"
      return 0
    elif command -v apt-get >/dev/null; then
      echo "setup: the build needs $*; as root run: apt-get install $*" >&2
    else
      echo "setup: the build needs $* (Debian's names); install them" >&2
    fi
    exit 1
  fi
  # POLICY_RC_D: tests put the guard in their own directory, not in this machine's /usr/sbin.
  local log policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d} made_policy=0 rc=0
  log=$(mktemp)
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  printf 'setup: %-28s ' "apt-get $*"
  { [ $apt_updated = 1 ] || apt-get update; } >"$log" 2>&1 && apt_updated=1 \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
       >>"$log" 2>&1 || rc=$?
  [ $made_policy = 0 ] || rm -f "$policy"
  if [ $rc = 0 ]; then
    echo ok
    rm -f "$log"
  elif [ "$need" = optional ]; then
    echo "FAILED (see $log); the tests that need them will skip"
  else
    echo FAILED
    echo "setup: apt-get install $* failed; last lines of $log:" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
}

ensure_build_packages() {  # before anything is written
  local missing
  read -r -a missing <<<"$(missing_build_packages)"
  apt_install required "${missing[@]}"
}

venv_is_whole() {  # a venv whose pip runs; an interrupted `python -m venv` leaves none
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1
}

make_venv() {
  venv_is_whole && return 0
  if [ -e "$VENV/pyvenv.cfg" ]; then
    echo "setup: $VENV is half-made (its pip does not run); making it again"
    rm -rf "$VENV"
  fi
  mkdir -p "$(dirname "$VENV")"
  local log
  log=$(mktemp)
  if ! "$PYTHON" -m venv "$VENV" >"$log" 2>&1 || ! venv_is_whole; then
    rm -rf "$VENV"
    echo "setup: $PYTHON -m venv $VENV failed (removed again); last lines:" >&2
    tail -n 5 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  : "${VENV:?VENV=DIR tools/setup_python.sh: the venv to make}"
  TF=${TF:-2.21}
  PYTHON=${PYTHON:-}
  PINS=${PINS:-$(cd "$(dirname "$0")" && pwd)/pins/tf$TF.txt}
  choose_python
  ensure_build_packages
  make_venv
fi
