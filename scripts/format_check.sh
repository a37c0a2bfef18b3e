#!/usr/bin/env bash
# Lists every C++ file under src, tests and bench that clang-format (.clang-format's style)
# would change, and fails when there is one. `make format` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "error: clang-format not found (scripts/install_deps.sh installs it)" >&2; exit 1; }
bad=()
while IFS= read -r -d '' f; do
  clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
done < <(find src tests bench \( -name '*.h' -o -name '*.cc' \) -print0 | sort -z)
if [ ${#bad[@]} -gt 0 ]; then
  echo "error: ${#bad[@]} file(s) differ from .clang-format's style (run make format):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format-check: every file matches .clang-format ($(clang-format --version | sed 's/.*version //'))"
