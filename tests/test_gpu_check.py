"""tools/gpu_check.py, the GPU bit check of every Triton kernel, runs end to end on CPU
under Triton's interpreter (small shapes), so it still works when a GPU is lent; and a
kernel that differs from the reference makes it fail."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _run(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", **(env_extra or {})}
    env.pop("OUT", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_kernel_matches_under_the_interpreter():
    done = _run("--device", "cpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Failures: 0" in done.stdout
    for section in ("Casts, fake quantize, dequantize", "Scale swizzle", "scaled_mm Triton"):
        assert section in done.stdout
    for design in ("dot_scaled", "fp8_mma", "dequant_bf16"):
        assert f"| {design} |" in done.stdout


def test_a_wrong_kernel_is_reported(tmp_path):
    # A sitecustomize that breaks the Triton rowwise cast's scales: the script must see it.
    (tmp_path / "sitecustomize.py").write_text(
        "import mx_kernels.cast_plan as p\n"
        "_plan = p.plan_for\n"
        "def plan_for(op, *a, **k):\n"
        "    run = _plan(op, *a, **k)\n"
        "    if op != 'quantize_rowwise':\n"
        "        return run\n"
        "    def broken(x):\n"
        "        q, s = run(x)\n"
        "        return q, (s.view(__import__('torch').uint8) + 1).view(s.dtype)\n"
        "    return broken\n"
        "p.plan_for = plan_for\n"
        "import mx_kernels.cast as c\n"
        "c.plan_for = plan_for\n"
    )
    paths = [
        str(tmp_path),
        str(ROOT / "packages/mx-core/src"),
        str(ROOT / "packages/mx-kernels/src"),
    ]
    done = _run("--device", "cpu", env_extra={"PYTHONPATH": os.pathsep.join(paths)})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "rowwise fp8_e4m3" in done.stdout
