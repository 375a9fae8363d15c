#!/usr/bin/env bash
# Set up and run every test, as CI does (.ci/run calls this very script):
#  1. per package: a fresh venv holding only that package, its declared dependencies
#     (siblings built from this checkout) and its test extra; its own tests;
#  2. the dev venv with everything (tools/setup.sh): ruff, then the cross-package tests/.
# Usage: bash tools/test-all.sh   (env: PYTEST_ARGS, extra pytest arguments)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
venvs=${MX_VENVS:-$root/.venvs}
export PIP_DISABLE_PIP_VERSION_CHECK=1
read -r -a extra <<<"${PYTEST_ARGS:-}"

# package -> the siblings it depends on, in install order
declare -A deps=(
  [mx-core]=""
  [mx-kernels]="mx-core"
  [mx-dtensor]="mx-core mx-kernels"
  [mx-nn]="mx-core mx-kernels mx-dtensor"
)
for pkg in mx-core mx-kernels mx-dtensor mx-nn; do
  echo "=== $pkg: fresh venv with only its declared dependencies"
  venv=$venvs/$pkg
  rm -rf "$venv"
  "$python" -m venv "$venv"
  args=()
  for dep in ${deps[$pkg]}; do args+=("./packages/$dep"); done
  "$venv/bin/python" -m pip install --quiet -c constraints/cpu.txt "${args[@]}" "./packages/$pkg[test]"
  if [[ $pkg == mx-nn ]]; then bash tools/install-torchtitan.sh "$venv/bin/python"; fi
  # The tests must import the installed wheel, not the source tree.
  (cd "$root" && "$venv/bin/python" -m pytest "packages/$pkg/tests" -n auto -q "${extra[@]}")
done

echo "=== everything: dev venv, ruff, cross-package tests"
bash tools/setup.sh "$root/.venv"
"$root/.venv/bin/ruff" check .
"$root/.venv/bin/python" -m pytest tests -n auto -q "${extra[@]}"
