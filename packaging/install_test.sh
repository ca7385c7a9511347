#!/usr/bin/env bash
# The install a user gets (cmake --install --strip, as scripts/build.sh does),
# into a scratch prefix: stripped binaries, the Python package where the
# system's python3 looks for this prefix, the man page, the systemd unit, bash
# completion, and libgpufs usable through pkg-config and find_package.
#   install_test.sh BUILD_DIR SCRATCH PYTHON_DIR
set -euo pipefail
build=$1 scratch=$2 pydir=$3
prefix=$scratch/prefix
rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" --strip >/dev/null

for bin in bin/gpufs sbin/mount.gpufs; do
  [ -x "$prefix/$bin" ] || fail "$bin not installed"
  if readelf -S "$prefix/$bin" | grep -qE '\.debug_info|\.symtab'; then fail "$bin is not stripped"; fi
done
LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/gpufs" --version | grep -qx "gpufs [0-9.]*" || fail "gpufs --version"

# Python: the package, typed, importable in a clean environment, from the
# directory /usr/bin/python3 searches for the /usr/local prefix.
[ -n "$pydir" ] || fail "no GPUFS_PYTHON_DIR"
[ -f "$prefix/$pydir/gpufs/__init__.py" ] || fail "python package not at $pydir"
[ -f "$prefix/$pydir/gpufs/py.typed" ] || fail "py.typed missing"
[ ! -e "$prefix/$pydir/gpufs/__pycache__" ] || fail "__pycache__ installed"
env -i /usr/bin/python3 -c "import sys; assert '/usr/local/$pydir' in sys.path, sys.path" ||
  fail "/usr/local/$pydir is not on python3's default path"
(cd "$scratch" && env -i PYTHONPATH="$prefix/$pydir" /usr/bin/python3 -c \
  "import gpufs; assert gpufs.__file__.startswith('$prefix'), gpufs.__file__") ||
  fail "installed package does not import"

if command -v help2man >/dev/null; then
  man1=$prefix/share/man/man1/gpufs.1
  [ -f "$man1" ] || fail "no man page"
  grep -q -- 'force' "$man1" || fail "man page lacks the options"
  grep -q 'GPUFS_LOG_LEVEL' "$man1" || fail "man page lacks the environment"
  grep -q 'parents' "$man1" || fail "man page lacks put --parents"
  # The pages it names that are gpufs's own are installed.
  for page in $(grep -oE '(gpufs|mount\.gpufs)[a-z.@-]*\([0-9]\)' "$man1" | sort -u); do
    name=${page%(*} section=${page#*(}
    section=${section%)}
    [ -f "$prefix/share/man/man$section/$name.$section" ] || fail "man page names $page, not installed"
  done
fi

unit=$prefix/lib/systemd/system/gpufs@.service
[ -f "$unit" ] || fail "no systemd unit"
grep -q '^ExecStart=/usr/local/bin/gpufs mount %f --foreground' "$unit" || fail "unit ExecStart"

completion=$prefix/share/bash-completion/completions/gpufs
[ -f "$completion" ] || fail "no bash completion"
got=$(bash -c "source '$completion'; COMP_WORDS=(gpufs pu); COMP_CWORD=1; _gpufs; echo \${COMPREPLY[*]}")
[ "$got" = "put publish" ] || fail "completion of 'pu' gave '$got'"
got=$(bash -c "source '$completion'; COMP_WORDS=(gpufs mount /g --st); COMP_CWORD=3; _gpufs; echo \${COMPREPLY[*]}")
[ "$got" = "--state --store" ] || fail "completion of 'mount --st' gave '$got'"
got=$(bash -c "source '$completion'; COMP_WORDS=(gpufs put --pa); COMP_CWORD=2; _gpufs; echo \${COMPREPLY[*]}")
[ "$got" = "--parents" ] || fail "completion of 'put --pa' gave '$got'"
# bash-completion loads it from there on demand (the prefix standing for
# /usr/local/share, which bash-completion searches by default).
loader=/usr/share/bash-completion/bash_completion
[ -f "$loader" ] || fail "bash-completion is not installed (scripts/setup-deps.sh installs it): the completion never loads"
got=$(XDG_DATA_DIRS=$prefix/share:/usr/share bash -c "source $loader; __load_completion gpufs && complete -p gpufs")
[ "$got" = "complete -F _gpufs gpufs" ] || fail "bash-completion did not load the completion: '$got'"
# Every option a command's --help names is completed after a '-'.
for cmd in mount put get import ls stat rm migrate restart; do
  help=$(LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/gpufs" "$cmd" --help)
  offered=" $(bash -c "source '$completion'; COMP_WORDS=(gpufs $cmd -); COMP_CWORD=2; _gpufs; echo \${COMPREPLY[*]}") "
  for opt in $(grep -oE -- '(^|[ ,])--?[a-z][a-z-]*' <<<"$help" | tr -d ' ,' | sort -u); do
    [[ $offered == *" $opt "* ]] || fail "completion of 'gpufs $cmd -' lacks $opt (offered:$offered)"
  done
done

# libgpufs (built with the CUDA Toolkit only).
if [ -f "$prefix/lib/pkgconfig/gpufs.pc" ]; then
  flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --define-prefix --cflags --libs gpufs)
  cat > "$scratch/use.c" <<'C'
#include <gpufs/gpufs.h>
#include <stdio.h>
int main(void) { printf("%s\n", gpufs_last_error() ? "ok" : "ok"); return 0; }
C
  # shellcheck disable=SC2086
  cc "$scratch/use.c" -o "$scratch/use-pc" $flags || fail "pkg-config flags do not build"
  LD_LIBRARY_PATH=$prefix/lib "$scratch/use-pc" | grep -qx ok || fail "pkg-config build does not run"
  mkdir -p "$scratch/consumer"
  cat > "$scratch/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(gpufs 0.1 REQUIRED)
add_executable(use ../use.c)
target_link_libraries(use PRIVATE gpufs::gpufs)
CM
  cmake -S "$scratch/consumer" -B "$scratch/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
    >/dev/null || fail "find_package(gpufs) failed"
  cmake --build "$scratch/consumer/build" >/dev/null || fail "find_package build failed"
  LD_LIBRARY_PATH=$prefix/lib "$scratch/consumer/build/use" | grep -qx ok ||
    fail "find_package build does not run"
fi
echo "install_test: ok"
