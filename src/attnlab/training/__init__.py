"""attnlab.training — schedules, losses, the trainer, checkpoints and multi-process training.

- :class:`NoamLR`, :class:`WarmupCosineLR` (``schedules``)
- :func:`label_smoothed_cross_entropy`, :func:`token_loss`, :class:`TokenLoss` (``losses``)
- :class:`Trainer`, :class:`TrainConfig`, :class:`BatchSource`, :class:`IndexedBatches`
  (``trainer``); :class:`~attnlab.training.progress.RichProgress` (``progress``); the trainer's
  parts: :class:`~attnlab.training.metrics_log.MetricsLog` (``metrics_log``),
  :class:`~attnlab.training.stop.GracefulStop` (``stop``), durable writes (``files``)
- :func:`save_checkpoint`, :func:`load_config`, :func:`load_model_weights`,
  :func:`load_training_state`, :func:`verify_checkpoint`, :class:`CheckpointError` (``checkpoint``;
  the manifest's validation in ``manifest``, a reader holding a checkpoint against rotation in
  ``checkpoint_hold``, sizes bounded by the stored tensors in ``sizes``,
  strict JSON in ``jsonio``)
- :class:`DivergenceError` (``divergence``): a non-finite loss, gradient norm or weight stops a run
- :class:`RunLock`, :func:`claim_run_dir` (``run_lock``, ``run_dir``): one training per run
  folder, and no surprise overwrite of a folder that is not a run; data files' fingerprints
  (``data_files``) let a resumed run notice changed data
- :func:`init_distributed`, :func:`shard_batch`, the parallel strategies, :class:`PeerLostError`
  (a rank lost mid-training) (``processes``)
"""

from attnlab.training.checkpoint import (
    CheckpointError,
    load_config,
    load_model_weights,
    load_training_state,
    read_checkpoint_file,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from attnlab.training.divergence import DivergenceError
from attnlab.training.losses import TokenLoss, label_smoothed_cross_entropy, token_loss
from attnlab.training.processes import DistInfo, PeerLostError, init_distributed, shard_batch
from attnlab.training.rng import get_rng_state, seed_everything, set_rng_state
from attnlab.training.run_dir import claim_run_dir
from attnlab.training.run_lock import RunLock
from attnlab.training.schedules import NoamLR, WarmupCosineLR
from attnlab.training.trainer import (
    BatchSource,
    IndexedBatches,
    StepMetrics,
    TrainConfig,
    Trainer,
    TrainerCallback,
    TrainResult,
)

__all__ = [
    "BatchSource",
    "CheckpointError",
    "DistInfo",
    "DivergenceError",
    "IndexedBatches",
    "NoamLR",
    "PeerLostError",
    "RunLock",
    "StepMetrics",
    "TokenLoss",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "WarmupCosineLR",
    "claim_run_dir",
    "get_rng_state",
    "init_distributed",
    "label_smoothed_cross_entropy",
    "load_config",
    "load_model_weights",
    "load_training_state",
    "read_checkpoint_file",
    "resolve_checkpoint",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "shard_batch",
    "token_loss",
    "verify_checkpoint",
]
