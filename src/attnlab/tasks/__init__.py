"""Tasks: recipes of model + data + optimiser + evaluation, and the one path from text to input.

One module a task family:

* :mod:`.algorithmic` — copy / reverse / sort (encoder-decoder, exact-match accuracy);
* :mod:`.lm` — a GPT language model on a UTF-8 text file (characters or BPE);
* :mod:`.translate` — an encoder-decoder on a parallel corpus (BLEU with beam search).

:mod:`.base` says what a task is (:class:`Task`, :class:`TaskSetup`, :class:`TaskIO`,
:class:`ModelInputs`), :mod:`.registry` which tasks exist, and :mod:`.run` loads a trained run with
its task (:func:`load_run`), which every command that reads a run uses.
"""

from attnlab.tasks.base import ModelInputs, Task, TaskIO, TaskSetup
from attnlab.tasks.registry import TASK_MODULES, available_tasks, get_task, register_task
from attnlab.tasks.run import Run, load_run

__all__ = [
    "TASK_MODULES",
    "ModelInputs",
    "Run",
    "Task",
    "TaskIO",
    "TaskSetup",
    "available_tasks",
    "get_task",
    "load_run",
    "register_task",
]
