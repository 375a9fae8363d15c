#!/usr/bin/env bash
# Set up the development environment: .venv with every package (editable), test extras,
# mx-nn's train extra (the mx-train command) and ruff. CPU machines get the pinned CPU
# torch through constraints/cpu.txt, never a CUDA build. Usage: bash tools/setup.sh [VENV_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
python=${PYTHON:-python3}
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/constraints/cpu.txt")
"${pip[@]}" --upgrade pip >/dev/null
"${pip[@]}" \
  -e "$root/packages/mx-core[test]" \
  -e "$root/packages/mx-kernels[test]" \
  -e "$root/packages/mx-dtensor[test]" \
  -e "$root/packages/mx-nn[test,train]" \
  "ruff>=0.6"
bash "$root/tools/install-torchtitan.sh" "$venv/bin/python"
echo "environment ready: $venv"
