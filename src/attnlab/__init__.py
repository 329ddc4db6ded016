"""attnlab — Transformer attention from the equations up.

The public API; everything else is reachable through the subpackages.
"""

from attnlab.nn import masks
from attnlab.nn.attention import scaled_dot_product_attention

__version__ = "0.1.0"

__all__ = ["__version__", "masks", "scaled_dot_product_attention"]
