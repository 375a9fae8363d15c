"""The README's first command sets up and runs mx-train (CI runs a short version of the
same console script: packages/mx-nn/tests/train/test_cli.py)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_first_readme_command_runs_mx_train():
    text = (ROOT / "README.md").read_text()
    first = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0]
    command = first.strip().splitlines()[-1]
    assert command == "bash tools/setup.sh && .venv/bin/mx-train"
    assert '[test,train]"' in (ROOT / "tools" / "setup.sh").read_text()
    pyproject = (ROOT / "packages" / "mx-nn" / "pyproject.toml").read_text()
    assert 'mx-train = "mx_nn.train.cli:console"' in pyproject
