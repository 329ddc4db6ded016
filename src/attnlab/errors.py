"""The exceptions attnlab raises on purpose: the user's mistakes, by type.

Every error that attnlab raises because of what it was given — an argument, a config, a file,
a command-line option — is an :class:`AttnlabError`. The concrete classes are also the built-in
type a Python user expects (:class:`ArgumentError` is a ``ValueError``, :class:`ArgumentTypeError`
a ``TypeError``), so ``except ValueError`` keeps working. Anything else that escapes attnlab — a
``RuntimeError`` from torch, a ``KeyError``, a ``ValueError`` raised inside another library — is a
bug, and the command line shows it with its traceback (:mod:`attnlab.cli.errors`).

The hierarchy::

    AttnlabError                       the user's mistake (the CLI prints one line, exit 2)
    ├── ArgumentError(ValueError)      a value out of range, a wrong shape, a bad combination
    │   ├── CheckpointError            a run folder or checkpoint that cannot be read
    │   ├── NotARunFolderError         a path that is not a run folder
    │   ├── RunFolderBusyError         a run folder another process is writing
    │   └── DivergenceError            training diverged (a non-finite loss)
    ├── ArgumentTypeError(TypeError)   a value of the wrong type
    └── PeerLostError                  a torchrun training lost a rank (attnlab.training.processes):
                                       not a mistake, yet one line: which rank, how to resume

    UntrainedLengthWarning(UserWarning)  a text longer than any the model was trained on: it is
                                         answered all the same, likely poorly (the CLI prints one
                                         ``attnlab: warning:`` line)
"""

from __future__ import annotations

__all__ = ["ArgumentError", "ArgumentTypeError", "AttnlabError", "UntrainedLengthWarning"]


class AttnlabError(Exception):
    """Base of every error attnlab raises on purpose about its input (the user's mistake)."""


class ArgumentError(AttnlabError, ValueError):
    """A value attnlab refuses: out of range, a wrong shape, a combination that cannot work.

    The message names the argument and says what was expected and what was got.
    """


class ArgumentTypeError(AttnlabError, TypeError):
    """A value of the wrong type; the message names the argument, the expected and the actual type."""


class UntrainedLengthWarning(UserWarning):
    """A text longer than the longest the model was trained on, yet within its positions: it is
    answered, but the answer is likely poor (a translation run's
    :attr:`~attnlab.tasks.seq2seq.Seq2SeqIO.longest_trained`)."""
