#!/usr/bin/env bash
# Install each built wheel alone in a fresh venv, the way a user runs `pip install
# mx-kernels`, and import it. Third-party dependencies come from the index (torch
# through constraints/cpu.txt); siblings must come from DIST, and the installed
# siblings' versions are checked against DIST so that a same-named project on an index
# cannot stand in for one. Usage: bash tools/check_wheels.sh DIST  (after `hatch build
# --all DIST`; env: PYTHON, WHEEL_VENVS)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=$(cd "${1:?usage: check_wheels.sh DIST}" && pwd)
python=${PYTHON:-python3}
if [[ -n ${WHEEL_VENVS:-} ]]; then
  venvs=$WHEEL_VENVS
else
  venvs=$(mktemp -d)
  trap 'rm -rf "$venvs"' EXIT
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
shopt -s nullglob
wheels=("$dist"/*.whl)
sdists=("$dist"/*.tar.gz)
((${#wheels[@]})) || { echo "no wheels in $dist" >&2; exit 1; }
((${#wheels[@]} == ${#sdists[@]})) || { echo "$dist: ${#wheels[@]} wheels, ${#sdists[@]} sdists" >&2; exit 1; }
for wheel in "${wheels[@]}"; do
  file=$(basename "$wheel")
  dist_name=${file%%-*}             # mx_kernels
  version=${file#*-}; version=${version%%-*}
  echo "=== $file: fresh venv, this wheel alone"
  venv=$venvs/$dist_name
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet -c "$root/constraints/cpu.txt" \
    --find-links "$dist" "$wheel"
  # Every installed mx-* distribution must be one of the wheels just built.
  "$venv/bin/python" - "$dist" "$dist_name" "$version" <<'EOF'
import importlib, importlib.metadata as md, pathlib, sys

dist, name, version = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
built = {p.name.split("-")[0]: p.name.split("-")[1] for p in dist.glob("*.whl")}
for d in md.distributions():
    key = d.metadata["Name"].replace("-", "_").lower()
    if key in built and d.version != built[key]:
        sys.exit(f"{d.metadata['Name']} {d.version} installed, but {built[key]} was built")
module = importlib.import_module(name)
assert module.__version__ == version, (module.__version__, version)
print(f"import {name}: {module.__version__}, from {pathlib.Path(module.__file__).parent}")
EOF
done
