#!/usr/bin/env bash
# Says which Python interpreters on the PATH (and the system's python3)
# import the gpufs package, and from where, and how to give it to one that
# does not: a virtual environment, pyenv, conda... scripts/run.sh installs it
# for the system's python3 only, and ends with this.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
seen=" "
while read -r candidate; do
  # One line per interpreter (by its sys.prefix: /bin/python3 is /usr/bin/python3).
  prefix=$("$candidate" -c 'import sys; print(sys.prefix)' 2>/dev/null) || continue
  case $seen in *" $prefix "*) continue ;; esac
  seen+="$prefix "
  exe=$("$candidate" -c 'import sys; print(sys.executable)')
  # PEP 668: the distribution's own interpreter refuses pip (not in a venv).
  managed=$("$exe" -c 'import os, sys, sysconfig
print(int(sys.prefix == sys.base_prefix and
          os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')
  if where=$(cd / && "$exe" -c 'import gpufs, os; print(os.path.dirname(gpufs.__file__))' 2>/dev/null); then
    echo "gpufs: $exe imports gpufs (from $where)"
  elif [ "$managed" = 1 ]; then
    echo "gpufs: $exe does not see the gpufs package; scripts/run.sh installs it there"
    echo "         (pip will not: the distribution manages that interpreter)"
  elif "$exe" -m pip --version >/dev/null 2>&1; then
    echo "gpufs: $exe does not see the gpufs package; add it with (no network needed):"
    echo "         $exe -m pip install $repo/python"
  else
    echo "gpufs: $exe does not see the gpufs package and has no pip; make a virtual"
    echo "         environment ($exe -m venv DIR) and run DIR/bin/pip install $repo/python"
  fi
done < <(type -ap python3; [ -x /usr/bin/python3 ] && echo /usr/bin/python3)
