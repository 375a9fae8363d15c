"""The end-of-training report: per-layer SQNR of MX against bf16, the summary table,
the figures (PNG, matplotlib Agg) and every figure's numbers as JSON."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import nn

from mx_core.testing import sqnr_db
from mx_nn.models.llama import TransformerBlock
from mx_nn.train.args import BF16
from mx_nn.train.guard import forward_hooked
from mx_nn.train.loop import RunResult

__all__ = ["gap_percent", "layer_sqnr", "table", "write_figures"]

_SHORT = {"attention.wq": "wq", "attention.wk": "wk", "attention.wv": "wv",
          "attention.wo": "wo", "feed_forward.w1": "w1", "feed_forward.w3": "w3",
          "feed_forward.w2": "w2", "": "block"}  # fmt: skip


@torch.no_grad()
def layer_sqnr(
    reference: nn.Module, mx: nn.Module, inputs: torch.Tensor, autocast: bool = True
) -> dict[str, float]:
    """SQNR in dB of each linear's, each block's and the logits' (``output``) output in
    ``mx`` against the same module of ``reference`` (same weights, bf16), on one batch
    of token ids under bf16 autocast (unless ``autocast`` is off).

    Args:
        reference: the bf16 model.
        mx: the same weights with MX linears.
        inputs: token ids, int64 [batch, seq], on the models' device.
        autocast: run under bf16 autocast.
    Returns:
        Module path -> SQNR in dB, in forward order.
    """
    outputs: dict[str, list[torch.Tensor]] = {}

    def hook_for(fqn: str, module: nn.Module):
        if not isinstance(module, nn.Linear | TransformerBlock):
            return None

        def hook(mod, args, out):
            outputs.setdefault(fqn, []).append(out.float())

        return hook

    for model in (reference, mx):
        forward_hooked(model, inputs, autocast, hook_for)
    return {fqn: sqnr_db(ref, approx) for fqn, (ref, approx) in outputs.items()}


def gap_percent(result: RunResult, baseline: RunResult) -> float:
    """How much higher a run's final held-out loss is than the baseline's.

    Args:
        result: the run.
        baseline: the bf16 run.
    Returns:
        The difference in % of the baseline's loss (negative: lower).
    """
    return (
        100
        * (result.final_heldout_loss - baseline.final_heldout_loss)
        / (baseline.final_heldout_loss)
    )


def _baseline(results: list[RunResult]) -> RunResult | None:
    return next((r for r in results if r.recipe == BF16), None)


def summary(results: list[RunResult], sqnr: dict[str, float] | None) -> dict:
    """What the table shows, as JSON-ready values."""
    base = _baseline(results)
    rows = []
    for r in results:
        gap = gap_percent(r, base) if base is not None and r is not base else None
        row = {"recipe": r.recipe, "train_loss": r.final_train_loss,
               "heldout_loss": r.final_heldout_loss, "gap_vs_bf16_pct": gap,
               "tokens_per_s": r.tokens_per_s, "peak_memory_mib": r.peak_memory_mib,
               "memory_kind": r.memory_kind}  # fmt: skip
        rows.append({k: _none_if_nan(v) for k, v in row.items()})
    return {"runs": rows, "sqnr_db": _finite(sqnr) if sqnr else None}


def _none_if_nan(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _finite(sqnr: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if math.isfinite(v) else None) for k, v in sqnr.items()}


def table(results: list[RunResult], sqnr: dict[str, float] | None) -> str:
    """The end-of-training report, as text.

    Args:
        results: every run's result, in order (a bf16 run is the baseline of the gaps).
        sqnr: :func:`layer_sqnr` of the last run, or None.
    Returns:
        The summary table (losses in nats per token, the gap to bf16, tokens/s, peak
        memory in MiB) and the per-layer SQNR lines, newline-joined.
    """
    s = summary(results, sqnr)
    head = f"{'run':<18}{'train loss':>11}{'held-out':>10}{'gap vs bf16':>13}" \
           f"{'tokens/s':>11}{'peak mem':>14}"  # fmt: skip
    lines = [head, "-" * len(head)]
    for row in s["runs"]:
        gap = "-" if row["gap_vs_bf16_pct"] is None else f"{row['gap_vs_bf16_pct']:+.2f}%"
        tps = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"
        lines.append(f"{row['recipe']:<18}{row['train_loss']:>11.4f}{row['heldout_loss']:>10.4f}"
                     f"{gap:>13}{tps:>11}{row['peak_memory_mib']:>10,.0f} MiB")  # fmt: skip
    kind = s["runs"][-1]["memory_kind"] if s["runs"] else ""
    lines.append(f"losses in nats/token (uniform bytes: ln 256 = {math.log(256):.2f}); "
                 f"peak mem: {kind}")  # fmt: skip
    if sqnr:
        lines.append(f"output SQNR of {results[-1].recipe} against bf16, same weights, one "
                     "held-out batch (dB):")  # fmt: skip
        blocks: dict[str, list[str]] = {}
        for fqn, value in sqnr.items():
            parts = fqn.split(".")
            if parts[0] == "layers":
                block, rest = ".".join(parts[:2]), ".".join(parts[2:])
                blocks.setdefault(block, []).append(f"{_SHORT.get(rest, rest)} {value:.1f}")
            else:
                blocks.setdefault(fqn, []).append(f"{value:.1f}")
        lines += [f"  {name:<10} " + "  ".join(items) for name, items in blocks.items()]
    return "\n".join(lines)


def write_figures(out: Path, results: list[RunResult], sqnr: dict[str, float] | None,
                  extra: dict) -> list[Path]:  # fmt: skip
    """Write the report's figures and their numbers; each file replaces an older one in
    one rename.

    Args:
        out: the run's folder.
        results: every run's result, in order.
        sqnr: :func:`layer_sqnr` of the last run, or None (no SQNR figure).
        extra: more JSON-ready entries for ``summary.json``.
    Returns:
        The paths written: ``loss_curves.png``/``.json``, ``sqnr.png``/``.json`` with
        ``sqnr``, and ``summary.json`` (the table's values plus ``extra``).
    """
    from mx_nn.train.extras import pyplot as plt

    paths = []
    curves = {r.recipe: {"steps": r.steps, "train_loss": r.train_loss,
                         "heldout_loss": r.heldout_loss} for r in results}  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (recipe, c) in enumerate(curves.items()):
        color = f"C{i}"
        ax.plot(c["steps"], c["train_loss"], "--", color=color, label=f"{recipe} train")
        ax.plot(c["steps"], c["heldout_loss"], "-o", ms=3, color=color,
                label=f"{recipe} held-out")  # fmt: skip
    ax.set(xlabel="step", ylabel="loss (nats/token)", title="mx-train loss curves")
    ax.grid(alpha=0.3)
    ax.legend()
    paths += _save(fig, out / "loss_curves.png", plt)
    paths += _dump(out / "loss_curves.json", {"unit": "nats/token", "runs": curves})
    if sqnr:
        names, values = list(sqnr), [v if math.isfinite(v) else 0.0 for v in sqnr.values()]
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(names) + 2), 4.5))
        ax.bar(range(len(names)), values, color="C1")
        ax.set_xticks(range(len(names)), names, rotation=75, ha="right", fontsize=7)
        ax.set(ylabel="SQNR (dB)",
               title=f"per-layer output SQNR, {results[-1].recipe} vs bf16")  # fmt: skip
        ax.grid(axis="y", alpha=0.3)
        paths += _save(fig, out / "sqnr.png", plt)
        paths += _dump(out / "sqnr.json", {"recipe": results[-1].recipe, "unit": "dB",
                                           "batch": "first held-out batch",
                                           "sqnr_db": _finite(sqnr)})  # fmt: skip
    paths += _dump(out / "summary.json", {**summary(results, sqnr), **extra})
    return paths


# Each file is written beside its final name and renamed over it: a run killed while
# writing the report leaves the previous file or the new one, never half of one.
def _save(fig, path: Path, plt) -> list[Path]:
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    try:
        fig.savefig(tmp, dpi=110, format=path.suffix[1:])
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return [path]


def _dump(path: Path, obj: dict) -> list[Path]:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return [path]
