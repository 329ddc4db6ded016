"""The memory a model and one training step need, from the config's sizes alone (nothing
allocated), so that a run too large for the machine is refused before it starts
(:func:`attnlab._budget.check_fits`).

Parameters are counted exactly (:func:`attnlab.inspect.flops`; tied weights once); the training
state adds their gradients and AdamW's two fp32 moments. The activations a step keeps for the
backward pass are a lower bound, per layer and token (``d = d_model``, ``d_ff`` the
feed-forward width):

    ACTIVATION_WIDTHS · d + 2 · d_ff        (QKV, attention output, projections, norms,
                                             residuals; the feed-forward's two hidden tensors)

plus, once, the logits (``B · T · V``) and one layer's largest attention intermediate
(``flops``' ``attention_matrix``: the ``T × T`` weights of the explicit backend, or a kind's own,
e.g. Performer's ``(T_q + T_k) × m`` feature maps). It stays below what the forward saves for the
backward pass plus the logits' gradient (``tests/inspect/test_footprint.py`` measures it): what a
step certainly holds, so that a run this refuses could never have fit.

Examples:
    >>> from attnlab import GPTConfig
    >>> fp = training_footprint(GPTConfig(vocab_size=65, n_positions=64, n_embd=128,
    ...                                   n_layer=4, n_head=4), seq_len=64, batch=12)
    >>> fp.parameters
    809856
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.inspect.flops import flops
from attnlab.models.config import GPTConfig, TransformerConfig

__all__ = ["ACTIVATION_WIDTHS", "Footprint", "training_footprint"]

#: activations a layer keeps per token, in units of ``d_model`` (besides the feed-forward's)
ACTIVATION_WIDTHS = 8

_FP32 = 4


@dataclass(frozen=True)
class Footprint:
    """Bytes of a model and of one of its training steps (float32).

    Attributes:
        parameters: the parameter count (tied weights once).
        weights: bytes of the parameters.
        training_state: weights, gradients and AdamW's two moments.
        activations: what one forward keeps for the backward pass (a lower bound, see the
            module docstring), the logits and one layer's attention intermediate included.
    """

    parameters: int
    weights: int
    training_state: int
    activations: int


def training_footprint(
    config: GPTConfig | TransformerConfig, seq_len: int, batch: int, *, src_len: int | None = None
) -> Footprint:
    """The memory of ``config``'s model and of a training step on ``batch`` sequences of
    ``seq_len`` tokens, from the sizes alone.

    Args:
        config: a :class:`~attnlab.GPTConfig` or :class:`~attnlab.TransformerConfig`.
        seq_len: tokens per sequence (the target's for the encoder-decoder); at most the
            model's positions.
        batch: sequences per step.
        src_len: source tokens of the encoder-decoder; default ``seq_len``.

    Returns:
        A :class:`Footprint`.

    Raises:
        ValueError: a length or ``batch`` out of range (:func:`attnlab.inspect.flops`).
    """
    report = flops(config, seq_len, batch, src_len=src_len)
    memory = report.memory
    if isinstance(config, GPTConfig):
        d, d_ff, vocab = config.n_embd, config.ff_width, config.vocab_size
        layer_tokens = config.n_layer * seq_len
    else:
        d, d_ff, vocab = config.d_model, config.d_ff, config.tgt_vocab_size
        s = seq_len if src_len is None else src_len
        layer_tokens = config.num_encoder_layers * s + config.num_decoder_layers * seq_len
    per_token = ACTIVATION_WIDTHS * d + 2 * d_ff
    activations = _FP32 * batch * (layer_tokens * per_token + seq_len * vocab)
    return Footprint(
        parameters=report.params["total"],
        weights=memory["parameters"],
        training_state=memory["training_state"],
        activations=activations + memory["attention_matrix"],
    )
