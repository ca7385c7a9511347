#!/usr/bin/env bash
# Runs README.md's tour as written, as a user would right after
# scripts/run.sh: the install (into a scratch prefix, put first on PATH and
# PYTHONPATH), a mounted gpufs (host store, its own state directory), and
# every "# command" line of the tour, /gpu standing for the mount. Each
# command must succeed; where the README shows "same", "refused" or a Python
# result, that line must be printed; what it shows of getfattr, gpufs ls -l,
# gpufs stat and the stats file must be what is printed, line for line
# ("..." standing for anything, cuda:0 for the device the mount serves,
# the stats file's JSON on one line).
#   readme_tour_test.sh BUILD_DIR SCRATCH PYTHON_DIR
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$1 scratch=$2 pydir=$3
rm -rf "$scratch"
mkdir -p "$scratch/mnt" "$scratch/state" "$scratch/cwd"
mnt=$scratch/mnt
daemon=""
cleanup() {
  if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
  # The daemon exits after the unmount; wait for it before removing its state.
  if [ -n "$daemon" ]; then tail --pid="$daemon" -f /dev/null; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "readme_tour_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$scratch/prefix" --strip >/dev/null
export PATH=$scratch/prefix/bin:$scratch/prefix/sbin:/usr/bin:$PATH
export PYTHONPATH=$scratch/prefix/$pydir
export LD_LIBRARY_PATH=$scratch/prefix/lib
[ "$(command -v gpufs)" = "$scratch/prefix/bin/gpufs" ] || fail "installed gpufs not first on PATH"

# As run.sh does: `gpufs mount` returns once the mount answers.
gpufs mount "$mnt" --state "$scratch/state" --store host --capacity 256M ||
  fail "mount failed: $(cat "$scratch/state/gpufs.log" 2>/dev/null)"
daemon=$(cut -d" " -f1 "$scratch/state/lock")  # the supervisor (then its worker)
[ -f "$mnt/.gpufs/stats" ] || fail "no mount"

device=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["default_device"])' \
  "$mnt/.gpufs/stats")

# A README output line as a bash pattern: literal but for "..." (anything).
quote_glob() { sed 's/[][*?\\]/\\&/g' <<<"$1"; }
as_pattern() {
  local text=$1 out=""
  while [[ $text == *"..."* ]]; do
    out+=$(quote_glob "${text%%...*}")"*"
    text=${text#*...}
  done
  printf '%s' "$out$(quote_glob "$text")"
}
# Every line of `out` matches one of the README's, and every README line one of `out`'s.
same_lines() {
  local out=$1 line exp found
  shift
  for exp in "$@"; do
    found=0
    while IFS= read -r line; do
      # shellcheck disable=SC2053
      [[ $line == $(as_pattern "${exp//cuda:0/$device}") ]] && found=1
    done <<<"$out"
    [ "$found" = 1 ] || fail "'$cmd' did not print '$exp': $out"
  done
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    found=0
    for exp in "$@"; do
      # shellcheck disable=SC2053
      [[ $line == $(as_pattern "${exp//cuda:0/$device}") ]] && found=1
    done
    [ "$found" = 1 ] || fail "'$cmd' printed '$line', which the README does not show"
  done <<<"$out"
}

# The tour: "# command" lines, each followed by what it prints ("# file:"
# is getfattr's).
tour=$(sed -n '/^<!-- tour/,/^<!-- \/tour -->/p' "$repo/README.md" | sed '/^```/d;/^<!--/d')
[ -n "$tour" ] || fail "no tour in README.md"
ran=0
cmd=""
expected=()
check() {
  [ -n "$cmd" ] || return 0
  local run=${cmd//\/gpu/$mnt}
  local out line
  out=$(cd "$scratch/cwd" && bash -c "$run" 2>&1) || fail "'$cmd' failed: $out"
  ran=$((ran + 1))
  out=${out//$mnt//gpu}
  case $cmd in
    "getfattr "*|"gpufs ls -l "*|"gpufs stat "*)
      same_lines "$out" "${expected[@]}" ;;
    "cat /gpu/.gpufs/stats")
      out=$(tr -s ' \n' ' ' <<<"$out")
      same_lines "${out% }" "${expected[@]}" ;;
    *"echo same"|*"echo refused"|"python3 -c "*)
      for line in "${expected[@]}"; do
        line=${line%%  *#*}  # "output     # a comment"
        [[ $line == "bash: "* ]] && continue  # the shell's own wording differs
        grep -qxF -- "$line" <<<"$out" || fail "'$cmd' did not print '$line': $out"
      done ;;
  esac
}
while IFS= read -r line; do
  if [[ $line == "# "* && $line != "# file: "* ]]; then
    check
    cmd=${line#\# } expected=()
  else
    expected+=("$line")
  fi
done <<<"$tour"
check
[ "$ran" -ge 15 ] || fail "only $ran tour commands found"
echo "readme_tour_test: $ran commands ok"
