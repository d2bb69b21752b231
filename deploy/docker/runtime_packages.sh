#!/bin/sh
# Prints, one per line and sorted, the packages that provide the shared
# libraries the given programs load (as ldd resolves them), so a runtime
# image installs exactly what the build it copies links to. Libraries that
# no package provides (e.g. the CUDA toolkit's under /usr/local/cuda, which
# a CUDA runtime base image brings) are named on stderr.
#
#   deploy/docker/runtime_packages.sh PROGRAM...
# Exit status 1 if a program is missing or ldd cannot resolve a library.
set -eu
[ "$#" -gt 0 ] || { echo "usage: runtime_packages.sh PROGRAM..." >&2; exit 2; }
status=0
libraries=$(
  for program in "$@"; do
    if [ ! -x "$program" ]; then
      echo "runtime_packages: $program is not an executable" >&2
      exit 1
    fi
    ldd "$program"
  done
) || exit 1
if echo "$libraries" | grep -q "not found"; then
  echo "runtime_packages: unresolved libraries:" >&2
  echo "$libraries" | grep "not found" >&2
  status=1
fi
for library in $(echo "$libraries" | awk '/=> \//{print $3}' | sort -u); do
  # dpkg records /lib or /usr/lib, whichever the package ships (merged /usr
  # makes both resolve).
  owner=""
  for path in "$library" "${library#/usr}" "/usr$library"; do
    owner=$(dpkg-query -S "$path" 2>/dev/null | head -n 1 | cut -d: -f1) || true
    [ -n "$owner" ] && break
  done
  if [ -n "$owner" ]; then
    echo "$owner"
  else
    echo "runtime_packages: no package provides $library" >&2
  fi
done | sort -u
exit "$status"
