#!/usr/bin/env bash
# scripts/fresh-check.sh — `make fresh-check`: the README's two commands on a truly fresh Debian 12.
#
# Why: CI runs on a machine that has been used before, so a package that scripts/install-deps.sh
# forgets can be there anyway (oneDNN's OpenCL, CBC's libz.so went unnoticed that way). This script
# builds a minimal Debian 12 (debootstrap --variant=minbase bookworm) once, keeps that pristine result
# as a tarball, and for every run unpacks a new copy, puts a clean `git clone` of the repository's HEAD
# into it (not the working tree: no build dirs, no node_modules, no uncommitted edits) and runs, as
# root in a chroot with a clean environment,
#     make test      then      make demo
# timing each and printing a summary with both times and their last lines.
#
# Environment:
#   FRESH_ROOT        cache folder (default /var/cache/lazytrain/fresh-bookworm): pristine tarball,
#                     the last run's system (run/) and its logs (logs/). Removed and rebuilt: run/.
#   FRESH_MIRROR      Debian mirror for debootstrap (default: the host's apt sources, else deb.debian.org)
#   FRESH_CMD         run this one command in the checkout instead of the two README commands, e.g.
#                     FRESH_CMD='bash scripts/install-deps.sh && make build' (mechanics, quickly)
#   FRESH_PREINSTALL  packages installed before the commands (default "make": minbase — like a
#                     fresh Debian install — has no make, and the README's commands are make
#                     targets; "" to see that fail)
#   FRESH_REF         what to check out (default HEAD)
#   FRESH_DIFF_PATHS  paths whose uncommitted changes (git diff HEAD) are applied to the clone, to
#                     try a change before committing it, e.g. FRESH_DIFF_PATHS=scripts/install-deps.sh
#   FRESH_REBUILD=1   debootstrap again even if the pristine tarball exists
#   FRESH_HOST_CA=0   don't copy the host's local CAs (/usr/local/share/ca-certificates) in
# Exit: 0 when every command passed, 1 when one failed, 2 on a setup error.
set -euo pipefail

prog=fresh-check
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FRESH_ROOT=${FRESH_ROOT:-/var/cache/lazytrain/fresh-bookworm}
FRESH_PREINSTALL=${FRESH_PREINSTALL-make}
FRESH_REF=${FRESH_REF:-HEAD}
suite=bookworm
pristine="$FRESH_ROOT/$suite-minbase.tar"
R="$FRESH_ROOT/run"          # the chroot of this run
logs="$FRESH_ROOT/logs"
src_in_chroot=/root/LazyTrain

say() { echo "$prog: $*"; }
die() { echo "$prog: $*" >&2; exit 2; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mounts): sudo make fresh-check"
[[ $FRESH_ROOT == /* && $FRESH_ROOT != / ]] || die "FRESH_ROOT must be an absolute path other than /"
mkdir -p "$FRESH_ROOT" "$logs"

# One run at a time per cache folder: a second run would unpack over the first one's live chroot.
exec 9> "$FRESH_ROOT/.lock"
flock -n 9 || die "another fresh-check is running on $FRESH_ROOT"

# ---------------------------------------------------------------------------------------------------
# Mounts and processes under $R are ours; everything here is undone on exit, failure or Ctrl-C. The
# /dev and /sys binds are recursive and made slaves, so unmounting them never touches the host's.
mounts_under() {  # prints mount points at or below $1, deepest first
  awk -v r="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == r || index(p, r "/") == 1) print p }' \
    /proc/self/mountinfo | sort -r
}
# shellcheck disable=SC2317  # reached through the trap
cleanup() {
  local rc=$? pid m
  trap - EXIT INT TERM
  if [[ -d $R ]]; then
    # Processes left in the chroot (an interrupted build or test) hold the mounts: end them by pid.
    for pid in /proc/[0-9]*; do
      if [[ $(readlink "$pid/root" 2>/dev/null) == "$R" ]]; then kill -TERM "${pid#/proc/}" 2>/dev/null || true; fi
    done
    sleep 0.5
    for pid in /proc/[0-9]*; do
      if [[ $(readlink "$pid/root" 2>/dev/null) == "$R" ]]; then kill -KILL "${pid#/proc/}" 2>/dev/null || true; fi
    done
    while read -r m; do
      [[ -n $m ]] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "$prog: warning: could not unmount $m" >&2
    done < <(mounts_under "$R")
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------------
# The mirror the host's apt uses (deb822 .sources first, then one-line .list), so debootstrap and the
# chroot's apt reach the same one.
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    # A stanza with Suites: bookworm and a URIs: line; the first such URI.
    awk 'BEGIN { RS = ""; FS = "\n" }
         /(^|\n)Suites:[^\n]*(^| )bookworm( |$|\n)/ && !/(^|\n)Enabled: *no/ {
           for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, u, " "); print u[2]; exit } }' "$f"
  done
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { if ($(i + 1) == "bookworm") print $i; break } }'
}
mirror=${FRESH_MIRROR:-$(host_mirror | grep -m1 . || true)}
mirror=${mirror:-http://deb.debian.org/debian}

# ---------------------------------------------------------------------------------------------------
# 1. The pristine system, once (debootstrap takes a few minutes); kept as a tarball so no run can
# modify it.
if [[ ! -f $pristine || ${FRESH_REBUILD:-0} == 1 ]]; then
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  boot="$FRESH_ROOT/debootstrap.tmp"
  [[ -z $(mounts_under "$boot") ]] || die "something is mounted under $boot; unmount it first"
  rm -rf --one-file-system "$boot"
  say "debootstrap --variant=minbase $suite from $mirror (once; cached in $pristine)"
  t0=$(date +%s)
  debootstrap --variant=minbase "$suite" "$boot" "$mirror" > "$logs/debootstrap.log" 2>&1 \
    || { tail -20 "$logs/debootstrap.log" >&2; die "debootstrap failed (log: $logs/debootstrap.log)"; }
  rm -rf "${boot:?}"/var/cache/apt/archives/*.deb
  tar --numeric-owner -C "$boot" -cpf "$pristine.tmp" .
  mv "$pristine.tmp" "$pristine"
  rm -rf --one-file-system "$boot"
  say "pristine system ready in $(($(date +%s) - t0)) s ($(du -h "$pristine" | cut -f1))"
fi

# 2. A fresh copy of it for this run (the previous run's copy is removed first, never while something
# is mounted inside it).
[[ -z $(mounts_under "$R") ]] || die "something is still mounted under $R; unmount it first"
rm -rf --one-file-system "$R"
mkdir -p "$R"
tar --numeric-owner -C "$R" -xpf "$pristine"

# Network and apt: the host's resolver, its apt sources (replacing debootstrap's one line, so no
# source is listed twice), the keyrings they name, and the apt settings needed to reach the same
# mirror (proxy, snapshot validity); nothing else of the host.
cp -L /etc/resolv.conf "$R/etc/resolv.conf"
rm -f "$R/etc/apt/sources.list"
[[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$R/etc/apt/sources.list"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] || continue
  cp "$f" "$R/etc/apt/sources.list.d/"
  { grep -hoE 'Signed-By: *[^ ]+|signed-by=[^] ]+' "$f" || true; } | sed -E 's/^Signed-By: *|^signed-by=//' | while read -r k; do
    if [[ -f $k && ! -e $R$k ]]; then mkdir -p "$(dirname "$R$k")"; cp "$k" "$R$k"; fi
  done
done
for f in /etc/apt/apt.conf.d/*; do
  [[ -f $f ]] && grep -qiE 'Proxy|Check-Valid-Until|Check-Date' "$f" && cp "$f" "$R/etc/apt/apt.conf.d/"
done
# Certificate authorities the host trusts locally (/usr/local/share/ca-certificates: a network that
# inspects TLS, such as this sandbox's egress, needs its CA for npm to reach the registry; empty on an
# ordinary machine). ca-certificates' own install in the chroot picks them up. FRESH_HOST_CA=0: don't.
if [[ ${FRESH_HOST_CA:-1} == 1 ]] && compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$R/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
fi
# No service starts from a package's maintainer scripts inside the chroot.
printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod +x "$R/usr/sbin/policy-rc.d"

# 3. A clean clone of the repository at FRESH_REF: only what is committed (--no-local: objects are
# copied through git's transport, not hard-linked into the cache).
commit=$(git -C "$repo" rev-parse --verify "$FRESH_REF^{commit}")
git clone --quiet --no-local --no-checkout "$repo" "$R$src_in_chroot"
git -C "$R$src_in_chroot" -c advice.detachedHead=false checkout --quiet --detach "$commit"
if [[ -n ${FRESH_DIFF_PATHS:-} ]]; then
  # shellcheck disable=SC2086  # a list of paths
  git -C "$repo" diff HEAD -- $FRESH_DIFF_PATHS > "$logs/applied.diff"
  if [[ -s $logs/applied.diff ]]; then
    git -C "$R$src_in_chroot" apply "$logs/applied.diff"
    say "applied the uncommitted changes to: $(git -C "$R$src_in_chroot" diff --name-only | tr '\n' ' ')"
  fi
fi

# 4. Kernel file systems: a new proc, the host's /sys and /dev (recursive: /dev/shm and /dev/pts are
# used by the tests' threads and Python).
mount -t proc proc "$R/proc" 2>/dev/null || { mount --rbind /proc "$R/proc"; mount --make-rslave "$R/proc"; }
mount --rbind /sys "$R/sys"; mount --make-rslave "$R/sys"
mount --rbind /dev "$R/dev"; mount --make-rslave "$R/dev"

# Runs one shell command in the chroot with a clean environment (nothing of the host's environment:
# no LIBRARY_PATH, no toolchain in PATH), output to the terminal and to a log.
# It runs in the background and is waited for: bash runs a trap (TERM from a CI timeout, say) only
# when `wait` returns, never in the middle of a foreground command.
in_chroot() {  # in_chroot LOGNAME COMMAND
  local log="$logs/$1.log"
  chroot "$R" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd $src_in_chroot && $2" > >(tee "$log") 2>&1 &
  wait $!
}

fmt_time() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
names=() cmds=() rcs=() secs=()
run_step() {  # run_step NAME COMMAND
  local t0 rc
  say "== $1: $2"
  t0=$(date +%s)
  set +e; in_chroot "$1" "$2"; rc=$?; set -e
  names+=("$1"); cmds+=("$2"); rcs+=("$rc"); secs+=($(($(date +%s) - t0)))
  say "== $1: exit $rc after $(fmt_time "${secs[-1]}")"
  return "$rc"
}

say "fresh Debian $suite (minbase) in $R; $(git -C "$repo" log -1 --format='%h %s' "$commit" | cut -c1-100)"
rm -f "$logs"/step-*.log
ok=1
if [[ -n $FRESH_PREINSTALL ]]; then
  run_step step-0-preinstall "apt-get update -qq && apt-get install -y -qq --no-install-recommends $FRESH_PREINSTALL >/dev/null && echo installed: $FRESH_PREINSTALL" || ok=0
fi
if ((ok)); then
  if [[ -n ${FRESH_CMD:-} ]]; then
    run_step step-1-cmd "$FRESH_CMD" || ok=0
  else
    # Both README commands run even if the first fails: each is a separate promise of the README.
    run_step step-1-make-test "make test" || ok=0
    run_step step-2-make-demo "make demo" || ok=0
  fi
fi

# ---------------------------------------------------------------------------------------------------
echo
echo "===================== fresh-check summary ($suite minbase, $(nproc) cores) ====================="
echo "commit: $(git -C "$repo" log -1 --format='%h %s' "$commit" | cut -c1-100)${FRESH_DIFF_PATHS:+ (+ uncommitted: $FRESH_DIFF_PATHS)}"
for i in "${!names[@]}"; do
  echo
  echo "-- ${cmds[$i]}: $( ((rcs[i] == 0)) && echo passed || echo "FAILED (exit ${rcs[$i]})") in $(fmt_time "${secs[$i]}") (log: $logs/${names[$i]}.log); last lines:"
  tail -n 8 "$logs/${names[$i]}.log" | sed 's/^/   | /'
done
echo
for i in "${!names[@]}"; do printf '%-70s %s %s\n' "${cmds[$i]:0:70}" "$(fmt_time "${secs[$i]}")" "$( ((rcs[i] == 0)) && echo ok || echo FAILED)"; done
((ok)) && { say "passed"; exit 0; }
say "FAILED"; exit 1
