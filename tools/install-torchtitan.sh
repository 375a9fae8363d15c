#!/usr/bin/env bash
# Install torchtitan's model code for mx-nn's real-model tests, without its trainer's
# dependencies (datasets, wandb, tensorboard, ...): the Llama3 model imports only
# spmd_types and tyro, which mx-nn's test extra lists. torchtitan needs Python >= 3.11;
# on older Pythons the tests that need it skip visibly.
# Usage: bash tools/install-torchtitan.sh PYTHON
set -euo pipefail
python=${1:?usage: install-torchtitan.sh PYTHON}
if "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  "$python" -m pip install --quiet --no-deps "torchtitan==0.3.0"
else
  echo "torchtitan needs Python >= 3.11: its tests will skip"
fi
