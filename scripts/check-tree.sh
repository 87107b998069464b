#!/usr/bin/env bash
# Fails when a tracked file is a build output: a compiled executable (ELF,
# Mach-O, PE), an executable that is not a script with a #! line, or a file
# over 1 MiB (pictures under docs/ excepted). CI runs it on every clone.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while IFS= read -r -d '' f; do
  [[ -f "$f" ]] || continue
  magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46|cffaedfe|cefaedfe|feedface|feedfacf|4d5a*)
      echo "check-tree: $f is a compiled executable; remove it and ignore the build output" >&2; bad=1; continue ;;
  esac
  if [[ -x "$f" ]] && [[ "$(head -c 2 "$f")" != '#!' ]]; then
    echo "check-tree: $f is executable but not a script" >&2; bad=1
  fi
  size=$(wc -c <"$f")
  if (( size > 1048576 )) && ! [[ "$f" == docs/* && "$f" =~ \.(png|jpg|jpeg|gif|svg|webp)$ ]]; then
    echo "check-tree: $f is $size bytes (over 1 MiB)" >&2; bad=1
  fi
done < <(git ls-files -z)
if (( bad )); then exit 1; fi
echo "check-tree: $(git ls-files | wc -l) tracked files, no build outputs, none over 1 MiB"
