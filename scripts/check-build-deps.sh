#!/usr/bin/env bash
# check-build-deps.sh BUILD_DIR             would a fresh Debian 12 get every package this build used?
# check-build-deps.sh --self-test BUILD_DIR the check itself catches a package missing from the list
#
# Why: scripts/install-deps.sh installs with --no-install-recommends, so a fresh machine has only the
# Depends/PreDepends closure of its list plus Debian's base (Essential / Priority: required). A machine
# that has been used for a while has more (Recommends pulled in long ago, packages installed by hand),
# and a build on it can silently use them: oneDNN's dnnl-config.cmake needed OpenCL
# (ocl-icd-opencl-dev) and CBC's pkg-config link line needed libz.so (zlib1g-dev), and CI stayed green
# while a fresh Debian 12 failed at CMake. This check asks dpkg who owns every file the build really
# used and fails when that package would not be on a fresh machine.
#
# Files the build used:
#   - every header in the compiler's dependency records   (ninja -t deps)
#   - every library on a link line                         (build.ninja: absolute paths, -lfoo resolved
#                                                           through the linker's search path)
#   - every CMake file the configure step read             (build.ninja's RERUN_CMAKE inputs: the
#                                                           package config files such as dnnl-config.cmake)
#   - every absolute path CMake cached that exists         (CMakeCache.txt: *_DIR, *_LIBRARY, ...)
# Ignored: the repository, the build directory, node_modules, /usr/local, and anything outside /usr,
# /lib*, /bin, /sbin, /etc, /opt that no package owns. Unowned files under /usr are warnings (made by
# hand? a fresh machine will not have them).
#
# Environment:
#   LT_DEPS_EXCLUDE="pkg1 pkg2"  drop these from install-deps.sh's list (simulates forgetting them;
#                                used by --self-test and useful to see what a package is needed for)
#   LT_DEPS_VERBOSE=1            print every file with its owner and verdict
# Exit: 0 all good, 1 a package is missing from install-deps.sh, 2 usage / environment error.
set -euo pipefail

prog=check-build-deps
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps_script="$root/scripts/install-deps.sh"

die() { echo "$prog: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------
# The package list, from install-deps.sh itself (the single source of truth). If install-deps.sh
# supports --list (it then prints its packages and installs nothing) that is used; the grep guards
# against running an older install-deps.sh that would ignore --list and start installing. Otherwise
# the `packages=( ... )` array is cut out and evaluated by bash, so comments and quoting in it are
# read exactly as install-deps.sh reads them.
list_packages() {
  [[ -f $deps_script ]] || die "no $deps_script"
  if grep -q -- '--list)' "$deps_script"; then
    bash "$deps_script" --list
  else
    local block
    block=$(sed -n '/^packages=(/,/^)/p' "$deps_script")
    [[ -n $block ]] || die "cannot find the packages=( ... ) array in $deps_script"
    (
      eval "$block"
      # shellcheck disable=SC2154  # assigned by the eval
      printf '%s\n' "${packages[@]}"
    )
  fi
}

# ---------------------------------------------------------------------------------------------------
# Files the build used, one absolute path per line (not yet filtered or normalized).
collect_files() {
  local build=$1 ninja_file=$1/build.ninja cache=$1/CMakeCache.txt

  # Headers: ninja's own record of every object's compiler-reported dependencies.
  ninja -C "$build" -t deps | awk '/^ +\// { sub(/^ +/, ""); print }'

  # CMake files read at configure time: the inputs of the edge that re-runs CMake. Ninja continues
  # long lines with a trailing `$`, so lines are joined first.
  awk '{ if (sub(/\$$/, "")) { buf = buf $0; next } print buf $0; buf = "" }' "$ninja_file" \
    | awk '/^build build\.ninja[: ].*RERUN_CMAKE/ { for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'

  # Link lines. -L directories on any link line come first in the search path, then the compiler's
  # own (what `cc -print-search-dirs` reports: the same list the driver passes to ld as -L).
  local link_tokens
  link_tokens=$(awk '/^ +(LINK_LIBRARIES|LINK_FLAGS|LINK_PATH) = / {
                       sub(/^ +[A-Z_]+ = /, ""); gsub(/-Wl,/, ""); gsub(/,/, " ")
                       for (i = 1; i <= NF; i++) print $i }' "$ninja_file" | sort -u)
  local -a search=()
  local t d
  while read -r t; do
    [[ $t == -L/* ]] && search+=("${t#-L}")
  done <<< "$link_tokens"
  local cxx
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache" 2>/dev/null | head -1)
  [[ -n $cxx && -x $cxx ]] || cxx=c++
  while read -r d; do
    [[ -n $d ]] && search+=("$d")
  done < <("$cxx" -print-search-dirs 2>/dev/null | sed -n 's/^libraries: =//p' | tr ':' '\n')

  while read -r t; do
    case $t in
      /*.so | /*.so.* | /*.a | /*.o) echo "$t" ;;
      -l:*)  # -l:name looks for that exact file name
        for d in "${search[@]}"; do
          if [[ -e $d/${t#-l:} ]]; then echo "$d/${t#-l:}"; break; fi
        done ;;
      -l*)   # ld's rule: in each directory in order, libNAME.so first, then libNAME.a
        local found=""
        for d in "${search[@]}"; do
          if [[ -e $d/lib${t#-l}.so ]]; then found=$d/lib${t#-l}.so; break; fi
          if [[ -e $d/lib${t#-l}.a ]]; then found=$d/lib${t#-l}.a; break; fi
        done
        if [[ -n $found ]]; then echo "$found"; else echo "$prog: warning: cannot resolve $t on the linker search path" >&2; fi ;;
    esac
  done <<< "$link_tokens"

  # CMake's cache: every absolute path value (a value may be a ;-list). Only existing paths are kept
  # later, so NOTFOUND values and stale entries drop out.
  sed -n 's/^[A-Za-z0-9_.+-]*:[A-Z]*=\(\/.*\)$/\1/p' "$cache" | tr ';' '\n' | awk '/^\//'
}

# ---------------------------------------------------------------------------------------------------
# The closure of what install-deps.sh installs on a fresh machine. apt-cache's --recurse output is
# over-inclusive (it recurses into every alternative and every provider of a virtual package), so it is
# used only as the dependency graph; the walk below follows, for each dependency group `a | b | <v>`:
#   the first alternative that is installed here (a real package, or a virtual one through its
#   installed providers), else the first alternative (a virtual one: all its providers).
# This mirrors apt on a fresh machine (first alternative) while respecting choices this machine made.
closure() {
  local installed=$1 graph=$2; shift 2
  awk -v roots="$*" '
    FNR == NR { inst[$1] = 1; next }                      # installed packages (first file)
    function strip(p) { sub(/:(any|amd64|i386|all|native)$/, "", p); return p }
    /^[^ ]/ {                                             # a package block starts
      cur = strip($0); ng[cur] += 0; pending = 0; next
    }
    /^ [ |](Pre)?Depends: / {
      alt = ($0 ~ /^ \|/); name = $2
      if (!pending) { g = ++ng[cur]; na[cur, g] = 0 }     # a new group unless the previous line had |
      a = ++na[cur, g]; an[cur, g, a] = strip(name); np[cur, g, a] = 0
      pending = alt; next
    }
    /^    / {                                             # a provider of the last dependency
      p = strip($1); k = ++np[cur, g, a]; prov[cur, g, a, k] = p; next
    }
    function choose(pkg, g,    a, n, k, pick, anyinst) {
      # Returns the chosen packages of group g of pkg in sel[] (cleared by the caller).
      for (a = 1; a <= na[pkg, g]; a++) {
        n = an[pkg, g, a]
        if (n !~ /^</) { if (n in inst) { sel[n] = 1; return } }
        anyinst = 0
        for (k = 1; k <= np[pkg, g, a]; k++)
          if (prov[pkg, g, a, k] in inst) { sel[prov[pkg, g, a, k]] = 1; anyinst = 1 }
        if (anyinst) return
      }
      n = an[pkg, g, 1]
      if (n !~ /^</) { sel[n] = 1; return }
      for (k = 1; k <= np[pkg, g, 1]; k++) sel[prov[pkg, g, 1, k]] = 1
    }
    END {
      nq = split(roots, q, " "); head = 1
      for (i = 1; i <= nq; i++) seen[q[i]] = 1
      while (head <= nq) {
        pkg = q[head++]; print pkg
        for (g = 1; g <= ng[pkg]; g++) {
          split("", sel); choose(pkg, g)
          for (s in sel) if (!(s in seen)) { seen[s] = 1; q[++nq] = s }
        }
      }
    }' "$installed" "$graph"
}

# ---------------------------------------------------------------------------------------------------
run_check() {
  local build=$1
  [[ -f $build/build.ninja ]] || die "no $build/build.ninja (configure and build first: make build)"
  [[ -f $build/CMakeCache.txt ]] || die "no $build/CMakeCache.txt"
  command -v ninja >/dev/null || die "ninja not found"
  local build_abs
  build_abs=$(cd "$build" && pwd -P)

  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT

  # 1. Files, normalized lexically (`..` removed, symlinks kept: a -dev package owns the libfoo.so
  # link itself, its target belongs to the runtime package), filtered to what a package could own.
  collect_files "$build" > "$tmp/raw"
  sort -u "$tmp/raw" | xargs -r -d '\n' realpath -s -m -- | sort -u \
    | awk -v repo="$root/" -v bld="$build_abs/" '
        index($0, repo) == 1 || index($0, bld) == 1 || $0 "/" == repo || $0 "/" == bld { next }
        /\/node_modules(\/|$)/ || /^\/usr\/local(\/|$)/ { next }
        /^\/(proc|sys|dev|tmp|run)(\/|$)/ { next }
        { print }' > "$tmp/files"

  # 2. For every file, the paths dpkg may know it by, in order: the path itself, each hop of its
  # symlink chain (alternatives: /usr/bin/c++ -> /etc/alternatives/c++ -> /usr/bin/g++), its full
  # realpath (a symlinked directory on the way); each with its /usr-merge twin (/lib/x <-> /usr/lib/x),
  # because bookworm still packages many libraries under /lib. Format: file <TAB> hop <TAB> path.
  local f cur t hop n
  while IFS= read -r f; do
    [[ -e $f ]] || continue
    hop=0; cur=$f
    printf '%s\t%d\t%s\n' "$f" "$hop" "$cur"
    while [[ -L $cur && $hop -lt 12 ]]; do
      t=$(readlink -- "$cur")
      [[ $t == /* ]] || t="${cur%/*}/$t"
      cur=$(realpath -s -m -- "$t")
      hop=$((hop + 1))
      printf '%s\t%d\t%s\n' "$f" "$hop" "$cur"
    done
    t=$(realpath -e -- "$f" 2>/dev/null || true)
    if [[ -n $t && $t != "$cur" ]]; then printf '%s\t%d\t%s\n' "$f" $((hop + 1)) "$t"; fi
  done < "$tmp/files" \
    | awk -F'\t' -v OFS='\t' '{ print
        p = $3
        if (p ~ /^\/usr\/(lib|lib32|lib64|libx32|bin|sbin)\//) { sub(/^\/usr/, "", p); print $1, $2, p }
        else if (p ~ /^\/(lib|lib32|lib64|libx32|bin|sbin)\//) print $1, $2, "/usr" p }' > "$tmp/candidates"

  # 3. Owners, from dpkg's file lists read once (much faster than one dpkg -S per file; a directory
  # can have many owners). Format: path <TAB> package.
  n=$(cut -f1 "$tmp/candidates" | sort -u | wc -l)
  cut -f3 "$tmp/candidates" | sort -u > "$tmp/wanted"
  awk -v OFS='\t' 'FNR == NR { want[$0] = 1; next }
        FNR == 1 { pkg = FILENAME; sub(/.*\//, "", pkg); sub(/\.list$/, "", pkg); sub(/:.*/, "", pkg) }
        ($0 in want) { print $0, pkg }' "$tmp/wanted" /var/lib/dpkg/info/*.list | sort -u > "$tmp/owned"

  # 4. The closure, plus the base every Debian system has.
  mapfile -t listed < <(list_packages | awk 'NF')
  ((${#listed[@]})) || die "install-deps.sh lists no packages"
  local -a roots=()
  local p x skip
  for p in "${listed[@]}"; do
    skip=0
    for x in ${LT_DEPS_EXCLUDE:-}; do [[ $p == "$x" ]] && skip=1; done
    ((skip)) || roots+=("$p")
  done
  dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' | awk '$2 == "ii" { print $1 }' > "$tmp/installed"
  if ! apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
       --no-replaces --no-enhances "${roots[@]}" apt > "$tmp/graph" 2> "$tmp/apt.err"; then
    cat "$tmp/apt.err" >&2
    die "apt-cache depends failed for install-deps.sh's packages (a misspelt package? run apt-get update?)"
  fi
  # apt is on every Debian too (debootstrap's minbase is Priority: required plus apt): its closure
  # counts as base, like the required packages.
  closure "$tmp/installed" "$tmp/graph" "${roots[@]}" apt > "$tmp/closure"
  dpkg-query -W -f='${Package} ${Essential} ${Priority}\n' \
    | awk '$2 == "yes" || $3 == "required" { print $1 }' >> "$tmp/closure"
  sort -u -o "$tmp/closure" "$tmp/closure"

  # 5. Verdict: a file's owners are those of the first hop dpkg knows; one of them in the closure is
  # enough (directories are shared).
  awk -F'\t' -v verbose="${LT_DEPS_VERBOSE:-0}" -v prog="$prog" '
    FILENAME == ARGV[1] { ok[$1] = 1; next }                                  # closure
    FILENAME == ARGV[2] { own[$1] = own[$1] (own[$1] == "" ? "" : " ") $2; next }  # owners
    {                                                                          # candidates
      files[$1] = 1
      if (!($3 in own)) next
      if (!($1 in besthop) || $2 < besthop[$1]) { besthop[$1] = $2; best[$1] = own[$3] }
      else if ($2 == besthop[$1]) best[$1] = best[$1] " " own[$3]
    }
    END {
      bad = 0
      for (f in files) {
        if (!(f in best)) {
          if (f ~ /^\/usr\//) printf "%s: warning: %s is used by the build but no Debian package owns it (made by hand or generated?): a fresh machine will not have it\n", prog, f
          continue
        }
        n = split(best[f], o, " "); good = 0; names = ""
        for (i = 1; i <= n; i++) {
          if (o[i] in ok) good = 1
          if (index(" " names " ", " " o[i] " ") == 0) names = names (names == "" ? "" : " ") o[i]
        }
        if (verbose) printf "%s: %s  %s  (%s)\n", prog, good ? "ok " : "BAD", f, names
        if (!good) {
          printf "%s: error: the build used %s from package %s, which scripts/install-deps.sh does not install on a fresh machine (not in the Depends closure of its list, not Essential/required): add %s to scripts/install-deps.sh\n", prog, f, names, names
          miss[names] = 1; bad++
        }
      }
      if (bad) {
        s = ""; for (m in miss) s = s " " m
        printf "%s: %d file(s) from packages missing from scripts/install-deps.sh:%s\n", prog, bad, s
        exit 1
      }
    }' "$tmp/closure" "$tmp/owned" "$tmp/candidates" | sort > "$tmp/report" || {
    # sort keeps the messages in a stable order; the summary line is moved last.
    grep -v ' file(s) from packages missing' "$tmp/report" || true
    grep ' file(s) from packages missing' "$tmp/report" || true
    return 1
  }
  cat "$tmp/report"
  echo "$prog: $n files the build used all come from packages install-deps.sh installs (${#roots[@]} listed, $(wc -l < "$tmp/closure") with their dependencies and Debian's base)"
}

# ---------------------------------------------------------------------------------------------------
# --self-test: the check passes on this build, and removing a package the build really uses (zlib1g-dev
# for CBC's -lz, ocl-icd-opencl-dev for oneDNN's OpenCL) is caught and named. A control exclusion of a
# package the build does not use (python3-torch: tests only) must still pass, so the check is specific.
self_test() {
  local build=$1 out rc failed=0
  local self="${BASH_SOURCE[0]}"
  expect() {  # expect NAME EXCLUDE RC [PATTERN...]
    local name=$1 excl=$2 want=$3; shift 3
    set +e
    out=$(LT_DEPS_EXCLUDE="$excl" bash "$self" "$build" 2>&1); rc=$?
    set -e
    local pat ok=1
    [[ $rc == "$want" ]] || ok=0
    for pat in "$@"; do grep -qF -- "$pat" <<< "$out" || ok=0; done
    if ((ok)); then
      echo "$prog self-test: ok    $name (exit $rc)"
    else
      echo "$prog self-test: FAIL  $name: wanted exit $want and [$*], got exit $rc:"
      tail -20 <<< "$out" | sed 's/^/    /'  # indented under the FAIL line
      failed=1
    fi
  }
  expect "the build passes with install-deps.sh's list" "" 0 "all come from packages"
  expect "without zlib1g-dev it is caught" "zlib1g-dev" 1 \
    "libz.so from package zlib1g-dev" "add zlib1g-dev to scripts/install-deps.sh"
  expect "without ocl-icd-opencl-dev it is caught" "ocl-icd-opencl-dev" 1 \
    "libOpenCL.so from package ocl-icd-opencl-dev" "add ocl-icd-opencl-dev to scripts/install-deps.sh"
  expect "without python3-torch (unused by the build) it still passes" "python3-torch" 0 "all come from packages"
  ((failed == 0)) || { echo "$prog self-test: FAILED"; return 1; }
  echo "$prog self-test: passed"
}

case ${1:-} in
  --self-test) [[ $# -eq 2 ]] || die "usage: $0 --self-test BUILD_DIR"; self_test "$2" ;;
  -h | --help | "") sed -n '2,3p' "$0" | sed 's/^# //'; [[ -n ${1:-} ]] ;;
  *) [[ $# -eq 1 ]] || die "usage: $0 BUILD_DIR | --self-test BUILD_DIR"; run_check "$1" ;;
esac
