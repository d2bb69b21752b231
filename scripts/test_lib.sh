# shellcheck shell=bash
# Helpers of the scripts' own tests (sourced; set -u is fine).
#
#   expect_usage_error WANT STARTED -- COMMAND... : COMMAND must exit 2 with
#   WANT in its standard error, before it creates STARTED (a file or a
#   folder it makes once it gets to work). Calls fail() of the sourcing
#   test on a mismatch.
expect_usage_error() {
  local want="$1" started="$2"
  shift 3  # want, started, --
  local err status
  err="$("$@" 2>&1 >/dev/null)"
  status=$?
  [[ $status -eq 2 ]] || fail "'$*' exited $status, want 2"
  grep -q -- "$want" <<<"$err" || fail "'$*' said '$err', want '$want'"
  [[ ! -e "$started" ]] || fail "'$*' got to work ($started exists)"
}
