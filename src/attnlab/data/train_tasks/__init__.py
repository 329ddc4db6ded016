"""The tasks of ``attnlab train``: copy, reverse, sort, lm and translate.

Importing this package registers them with :mod:`attnlab.training.tasks_registry` (which lists
it in ``TASK_MODULES``). Each task module holds one task family:

* :mod:`.algorithmic` — copy / reverse / sort (encoder-decoder, exact-match accuracy);
* :mod:`.lm` — a GPT language model on a UTF-8 text file (characters or BPE);
* :mod:`.translate` — an encoder-decoder on a parallel corpus (BLEU with beam search).
"""

from attnlab.data.train_tasks import algorithmic, lm, translate

__all__ = ["algorithmic", "lm", "translate"]
