"""Attention during training: record a fixed probe input's attention every N steps.

The seeds say that heads "learn different roles" while a model trains; this makes it visible.
:class:`AttentionProbe` is a :class:`~attnlab.training.trainer.TrainerCallback`: before the first
step (step 0), every ``every`` steps and after the last step it runs the model once on the probe —
in eval mode, without gradients, with the random states saved and restored, so recording never
changes the training trajectory — and writes the captured weights to

    RUN/probe/probe.json                 the probe: its tokens, and which layer reads which side
    RUN/probe/step-00000100.safetensors  one (H, T_q, T_k) float32 tensor per attention layer

each written to a temporary file and renamed into place. A resumed run drops the records past the
step it resumes from. :func:`load_probe_history` reads them back as a
:class:`~attnlab.viz.probe_history.ProbeHistory` for ``attnlab plot training`` and the viewer.

A layer whose keys are projected along the sequence (a Linformer encoder, ``--attention
linformer``) is recorded as it computes: its ``(H, T_q, k)`` weights over the ``k`` rows of
``E K``, labelled ``"E·K row j"`` in ``probe.json`` (with ``"projected": {layer: [method, token
sequence]}``), and beside them, under ``"effective:LAYER"``, its effective weights ``A · F`` over
the key tokens ``(H, T_q, T_k)`` at that step (see :class:`~attnlab.inspect.capture.ProjectedKeys`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnlab.errors import ArgumentError
from attnlab.tasks.base import ModelInputs
from attnlab.tasks.figures import capture_inputs, token_sequences
from attnlab.training.files import replace_file, safetensors_bytes
from attnlab.training.rng import get_rng_state, set_rng_state
from attnlab.training.trainer import StepMetrics, Trainer, TrainerCallback
from attnlab.viz.probe_history import ProbeHistory

__all__ = ["PROBE_DIR", "AttentionProbe", "load_probe_history", "write_training_figures"]

PROBE_DIR = "probe"
_META = "probe.json"
_STEP = re.compile(r"^step-(\d{8})\.safetensors$")
_EFFECTIVE = "effective:"  # the key of a projected layer's A · F in a step file: effective:LAYER


class AttentionProbe(TrainerCallback):
    """Record the attention of ``inputs`` every ``every`` steps (see the module docstring).

    Args:
        run_dir: the run folder.
        inputs: the probe, from the task's ``TaskIO.probe_inputs``.
        every: record every this many steps (>= 1); step 0 and the last step always.
        text: the probe's text, kept in ``probe.json``.
    """

    def __init__(self, run_dir: str | os.PathLike[str], inputs: ModelInputs, every: int, text: str):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ArgumentError(f"every must be a positive int, got {every!r}")
        self.dir = Path(run_dir) / PROBE_DIR
        self.inputs = inputs
        self.every = every
        self.text = text
        self._trainer: Trainer | None = None

    def on_start(self, trainer: Trainer) -> None:
        """Remember the trainer, drop records past the step it starts from, and record step 0.

        Args:
            trainer: the trainer that is starting (or resuming).
        """
        self._trainer = trainer
        self.dir.mkdir(parents=True, exist_ok=True)
        for f in self.dir.iterdir():  # records past the step we (re)start from
            m = _STEP.match(f.name)
            if m and int(m.group(1)) > trainer.step:
                f.unlink()
        if trainer.step == 0:
            self.record(0)

    def on_step(self, metrics: StepMetrics) -> None:
        """Record every ``every`` steps, and at the last step.

        Args:
            metrics: the step just done.
        """
        if metrics.step % self.every == 0 or metrics.step == metrics.total_steps:
            self.record(metrics.step)

    def record(self, step: int) -> Path:
        """Capture the probe's attention now and write it as the record of ``step``.

        Args:
            step: the step the record is for (its file name).

        Returns:
            The file written, ``<run_dir>/probe/step-<step>.safetensors``.

        Raises:
            RuntimeError: :meth:`on_start` was not called first.
        """
        if self._trainer is None:
            raise RuntimeError("AttentionProbe.record needs the trainer: call on_start first")
        model = self._trainer.model
        rng = get_rng_state()
        try:
            cache = capture_inputs(model, self.inputs)
        finally:
            set_rng_state(rng)
        # this step as a history of one step: its layers labelled, projected keys included, as
        # load_probe_history will read them back
        one = ProbeHistory.new(**token_sequences(self.inputs))
        one.record(step, cache.attentions, cache.kinds, projected=cache.projected)
        if not (self.dir / _META).exists():
            self._write_meta(one)
        tensors = {n: w[0].contiguous() for n, w in one.attentions.items()}
        tensors.update({_EFFECTIVE + n: e[0].contiguous() for n, e in one.effective.items()})
        path = self.dir / f"step-{step:08d}.safetensors"
        replace_file(path, safetensors_bytes(tensors, {"step": str(step)}))
        return path

    def _write_meta(self, history: ProbeHistory) -> None:
        meta = {
            "text": self.text,
            "every": self.every,
            "inputs": self.inputs.to_dict(),
            "sequences": history.sequences,
            "kinds": history.kinds,
            "layer_sequences": {n: list(v) for n, v in history.layer_sequences.items()},
            "projected": {n: list(v) for n, v in history.projected.items()},
        }
        replace_file(self.dir / _META, json.dumps(meta, ensure_ascii=False, indent=1).encode())


def load_probe_history(run_dir: str | os.PathLike[str]) -> ProbeHistory:
    """The recorded probe of a run, every step in order.

    Args:
        run_dir: the run folder.

    Returns:
        The probe's inputs and the attention recorded at each step (and, for layers with
        projected keys, their effective weights ``A · F``).

    Raises:
        ValueError: the run recorded no probe (train with ``--probe TEXT``), or its files do not
            agree with each other.
    """
    d = Path(run_dir) / PROBE_DIR
    if not (d / _META).is_file():
        raise ArgumentError(
            f"{run_dir} recorded no attention probe; train with --probe TEXT --probe-every N"
        )
    meta = json.loads((d / _META).read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or not isinstance(meta.get("kinds"), dict):
        raise ArgumentError(
            f"{d / _META} must be an object with 'kinds', 'sequences' and 'layer_sequences' "
            f"(as training writes it), got {type(meta).__name__}"
        )
    records = sorted(
        (int(m.group(1)), f) for f in d.iterdir() if (m := _STEP.match(f.name)) is not None
    )
    if not records:
        raise ArgumentError(f"{d} holds no recorded step")
    frames = [load_file(str(f)) for _, f in records]
    names = list(meta["kinds"])
    missing = [n for n in names for fr in frames if n not in fr]
    if missing:
        raise ArgumentError(f"{d}: a recorded step lacks the attention of {missing[0]!r}")
    attentions = {n: torch.stack([fr[n] for fr in frames]) for n in names}  # (S, H, T_q, T_k)
    effective: dict[str, torch.Tensor] = {}  # a projected layer's A · F at each step
    projected = meta.get("projected")
    for n in projected if isinstance(projected, dict) else ():
        have = [_EFFECTIVE + n in fr for fr in frames]
        if all(have):
            effective[n] = torch.stack([fr[_EFFECTIVE + n] for fr in frames])  # (S, H, T_q, T_k)
        elif any(have):
            raise ArgumentError(f"{d}: a recorded step lacks the effective weights of {n!r}")
    state = {"steps": [s for s, _ in records], "attentions": attentions, **meta}
    state["effective"] = effective
    try:  # every entry checked by the history itself, which names the bad one
        return ProbeHistory.from_state_dict(state)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{d / _META}: {exc}") from exc


def write_training_figures(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Draw a run's recorded probe: ``training.png`` (the heads of one layer from step 0 to the
    end), ``training_entropy.png`` (every head's mean entropy per step) and ``training.html``
    (the viewer with a step slider), in the run folder.

    Args:
        run_dir: the run folder, with a recorded probe.

    Returns:
        The paths written.

    Raises:
        ValueError: the run recorded no probe.
    """
    from attnlab.viz.evolution import attention_evolution, head_entropy_curves
    from attnlab.viz.evolution_viewer import viewer_data_from_history
    from attnlab.viz.viewer import write_viewer

    run = Path(run_dir)
    history = load_probe_history(run)
    paths = [run / "training.png", run / "training_entropy.png", run / "training.html"]
    attention_evolution(history).save(paths[0])
    head_entropy_curves(history).save(paths[1])
    title = f"attnlab · {run.name} · attention during training"
    write_viewer(viewer_data_from_history(history, title=title), paths[2])
    return paths
