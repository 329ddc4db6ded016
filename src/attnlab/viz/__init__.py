"""attnlab.viz — figures (matplotlib), attention during training, and the self-contained HTML
attention viewer."""

from attnlab.viz.evolution import (
    ProbeHistory,
    attention_evolution,
    head_entropy_curves,
    row_entropy,
    viewer_data_from_history,
)
from attnlab.viz.figures import (
    Plot,
    layer_head_grid,
    step_panel,
    step_panel_from_model,
    step_panel_from_module,
)
from attnlab.viz.viewer import (
    AttentionGroup,
    AttentionLayer,
    ViewerData,
    render_viewer,
    viewer_data,
    write_viewer,
)

__all__ = [
    "AttentionGroup",
    "AttentionLayer",
    "Plot",
    "ProbeHistory",
    "ViewerData",
    "attention_evolution",
    "head_entropy_curves",
    "layer_head_grid",
    "render_viewer",
    "row_entropy",
    "step_panel",
    "step_panel_from_model",
    "step_panel_from_module",
    "viewer_data",
    "viewer_data_from_history",
    "write_viewer",
]
