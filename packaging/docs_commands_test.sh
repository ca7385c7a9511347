#!/usr/bin/env bash
# docs_commands_test.sh: every repository path the documentation names
# exists in the source tree, so a reader who copies a command from the docs
# finds the script, test or file it runs.
#
#   packaging/docs_commands_test.sh [SOURCE_DIR]     (default: this checkout)
#
# Reads README.md, python/README.md and docs/*.md. A path is a word that
# starts with a top-level folder of the repository, or ./ and one (scripts/,
# bench/, tests/, examples/, docs/, core/, ...; not inside a longer path such as
# /usr/local/include/...): it must exist (a glob such as fs/fuse_*_ops.cc must
# match a file; a{b,c} stands for ab and ac). A build output named as
# build/DIR/NAME (build/bench/gpufs-bench, build/bin/gpufs) must be a target
# that some CMakeLists.txt makes (add_executable or gpufs_test); libraries
# (build/client/libgpufs.so) are not checked. Prints each path that
# does not exist, with its file and line; exit 1 if there is one.
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$src"

# The repository's top-level folders, as they are now (not build trees, nor
# hidden folders but .ci).
folders=$(find . -mindepth 1 -maxdepth 1 -type d ! -name 'build*' \( ! -name '.*' -o -name .ci \) \
  -printf '%f\n' |
  sed 's/\./\\./g' | sort | paste -sd'|' -)
docs=(README.md python/README.md docs/*.md)
path_chars='[A-Za-z0-9_.*+@{},/-]'

missing=0 checked=0
report() { echo "docs_commands_test: $1:$2: $3 $4" >&2; missing=$((missing + 1)); }

# Paths of the source tree: "FILE:LINE:PATH" per mention.
sources() {
  grep -noE "(^|[^A-Za-z0-9_./~\$-])(\./)?(${folders})/${path_chars}*" "${docs[@]}" |
    sed -E 's/^([^:]+:[0-9]+:)[^A-Za-z0-9_.]?(\.\/)?/\1/'
}
# Build outputs: "FILE:LINE:build/DIR/NAME" (DIR a source folder, or bin).
outputs() {
  grep -noE "(^|[^A-Za-z0-9_./~\$-])build/(${folders}|bin)/[A-Za-z0-9_.+-]+" "${docs[@]}" |
    sed -E 's/^([^:]+:[0-9]+:)[^A-Za-z0-9_.]?/\1/'
}

exists() {  # exists PATH: a file or folder, a glob that matches, or a{b,c}
  local p=$1 pre alts post alt
  if [[ $p =~ ^([^{]*)\{([^}]*)\}(.*)$ ]]; then
    pre=${BASH_REMATCH[1]} alts=${BASH_REMATCH[2]} post=${BASH_REMATCH[3]}
    IFS=, read -r -a alts <<< "$alts"
    for alt in "${alts[@]}"; do exists "$pre$alt$post" || return 1; done
    return 0
  fi
  if [[ $p == *'*'* ]]; then compgen -G "$p" > /dev/null; else [[ -e $p ]]; fi
}

while IFS=: read -r file line path; do
  path=${path%%[.,:;]}  # the end of a sentence or a list item
  path=${path%%[.,:;]}
  [[ -z $path || $path == */.. ]] && continue
  checked=$((checked + 1))
  exists "$path" || report "$file" "$line" "$path" "does not exist"
done < <(sources)

while IFS=: read -r file line path; do
  path=${path%%[.,:;]}
  name=${path##*/}
  [[ $name == lib*.so* ]] && continue  # a library: its target has another name
  checked=$((checked + 1))
  grep -rqsE --include=CMakeLists.txt "(add_executable|gpufs_test)\(${name//./\\.}[[:space:])]" . ||
    report "$file" "$line" "$path" "is no executable target of any CMakeLists.txt"
done < <(outputs)

if ((checked == 0)); then
  echo "docs_commands_test: found no path at all in ${docs[*]}: the pattern is broken" >&2
  exit 1
fi
if ((missing > 0)); then
  echo "docs_commands_test: $missing of $checked paths named in the docs do not exist" >&2
  exit 1
fi
echo "docs_commands_test: all $checked paths named in the docs exist"
