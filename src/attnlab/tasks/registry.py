"""The registry of tasks: ``attnlab train TASK`` and every command that reads a run ask it.

Register a task with :func:`register_task` at import time of its module, and list that module in
:data:`TASK_MODULES` so that the command line imports it. What a task is (its protocol) is
:class:`attnlab.tasks.base.Task`.
"""

from __future__ import annotations

import importlib

from attnlab.errors import ArgumentError, ArgumentTypeError
from attnlab.tasks.base import Task

__all__ = [
    "TASK_MODULES",
    "available_tasks",
    "get_task",
    "register_task",
]

#: modules imported to register the built-in tasks (a missing module is skipped)
TASK_MODULES: tuple[str, ...] = (
    "attnlab.tasks.algorithmic",
    "attnlab.tasks.lm",
    "attnlab.tasks.translate",
)

_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Make ``task`` available to ``attnlab train`` (a later registration of a name replaces it).

    Args:
        task: an object following :class:`Task`.

    Returns:
        ``task`` (so this works as a class-instance decorator helper).
    """
    for attr in ("name", "help", "build"):
        if not hasattr(task, attr):
            raise ArgumentTypeError(f"task must have {attr!r} (see attnlab.tasks.base.Task)")
    if not hasattr(task, "options") and not hasattr(task, "add_arguments"):
        raise ArgumentTypeError(
            "task must have 'options' (its options dataclass) or 'add_arguments' "
            "(see attnlab.tasks.base.Task)"
        )
    if not isinstance(task.name, str) or not task.name.isidentifier():
        raise ArgumentError(f"task.name must be an identifier-like string, got {task.name!r}")
    _REGISTRY[task.name] = task
    return task


def _load_builtin() -> None:
    for module in TASK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def available_tasks() -> dict[str, Task]:
    """The registered tasks by name (importing :data:`TASK_MODULES` first).

    Returns:
        Task name → task, in registration order.
    """
    _load_builtin()
    return dict(sorted(_REGISTRY.items()))


def get_task(name: str) -> Task:
    """The task called ``name``.

    Args:
        name: a registered task's name (``"copy"``, ``"reverse"``, ``"sort"``, ``"lm"``,
            ``"translate"``, ...).

    Returns:
        The task.

    Raises:
        ValueError: no such task (the message lists the known ones).
    """
    tasks = available_tasks()
    if name not in tasks:
        known = ", ".join(tasks) or "none registered"
        raise ArgumentError(f"unknown task {name!r}; known tasks: {known}")
    return tasks[name]
