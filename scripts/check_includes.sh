#!/usr/bin/env bash
# Fails when a file includes another component's internal header: "<comp>/<name>_internal.h" may
# be included only from src/<comp>/ (docs/STYLE.md, public vs internal), and from the fuzz
# harnesses of fuzz/, which drive a component's parsers directly, as the tests beside its code do.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
while IFS= read -r hit; do
  file=${hit%%:*}
  comp=$(sed -E 's|.*#include "([a-z0-9_]+)/[a-z0-9_]+_internal\.h".*|\1|' <<<"$hit")
  if [[ "$file" != src/"$comp"/* && "$file" != fuzz/* ]]; then
    echo "check_includes: $file includes an internal header of $comp: ${hit#*:}"
    bad=1
  fi
done < <(git grep -n -E '#include "[a-z0-9_]+/[a-z0-9_]+_internal\.h"' -- '*.cc' '*.h' || true)
((bad == 0)) && echo "check_includes: internal headers stay inside their components"
exit "$bad"
