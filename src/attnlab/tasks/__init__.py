"""Tasks: recipes of model + data + optimiser + evaluation, and the one path from text to input.

One module a task family:

* :mod:`.algorithmic` — copy / reverse / sort (encoder-decoder, exact-match accuracy);
* :mod:`.lm` — a GPT language model on a UTF-8 text file (characters or BPE);
* :mod:`.translate` — an encoder-decoder on a parallel corpus (BLEU with beam search).

:mod:`.base` says what a task is (:class:`Task`, :class:`TaskSetup`, :class:`TaskIO`,
:class:`ModelInputs`), :mod:`.registry` which tasks exist, and :mod:`.run` loads a trained run with
its task (:func:`load_run`), which every command that reads a run uses.

:func:`train` trains a task — ``attnlab train``, the notebooks and the benchmarks all call it —
from its typed options (:mod:`.train_options`: :class:`LMOptions`, :class:`TranslateOptions`,
:class:`AlgorithmicOptions`, over the shared :class:`TrainOptions`)::

    from attnlab import tasks
    run = tasks.train("reverse", out="runs/rev", steps=1200)
    run = tasks.train(tasks.LMOptions(data="tinyshakespeare", out="runs/shk", steps=2000))
    run.model, run.eval_metrics, run.run_dir
"""

from attnlab.tasks.base import ModelInputs, Task, TaskIO, TaskSetup
from attnlab.tasks.driver import TaskRun, train
from attnlab.tasks.registry import TASK_MODULES, available_tasks, get_task, register_task
from attnlab.tasks.run import Run, load_run
from attnlab.tasks.train_options import (
    AlgorithmicOptions,
    LMOptions,
    TrainOptions,
    TranslateOptions,
)

__all__ = [
    "TASK_MODULES",
    "AlgorithmicOptions",
    "LMOptions",
    "ModelInputs",
    "Run",
    "Task",
    "TaskIO",
    "TaskRun",
    "TaskSetup",
    "TrainOptions",
    "TranslateOptions",
    "available_tasks",
    "get_task",
    "load_run",
    "register_task",
    "train",
]
