"""attnlab.viz — figures (matplotlib), attention during training, and the self-contained HTML
attention viewer.

- attention views: :func:`attention_heatmap`, :func:`head_grid`, :func:`layer_head_grid`,
  :func:`reduce_attention` (``attention``)
- the step panel: :func:`step_panel`, :func:`step_panel_from_module`,
  :func:`step_panel_from_model` (``steps``); one head by hand from your own ``x`` and weights
  (or a file of them), with no mask or a model's masks: :func:`step_panel_by_hand`
  (``steps_by_hand``)
- lesson figures: :func:`mask_panel` (the masks of :func:`token_masks`), :func:`noam_curve`,
  :func:`positional_encoding_figure`
  (``lessons``); why scores are scaled by 1/√d_k: :func:`softmax_scaling_figure` (``scaling``)
- training: :func:`training_curves` (loss, learning rate and held-out metrics of a run),
  :func:`label_smoothing_figure` (``training``)
- cross-attention as a word alignment: :func:`alignment_heatmap` (``alignment``); every figure's
  token labels are drawn in a font that holds their script (:func:`font_for`, ``fonts``)
- approximations: :func:`approximation_error_figure` (Linformer's error against ``k``,
  Performer's against the number of random features) (``approximations``)
- costs: :func:`flops_figure` (FLOPs and memory vs length), :func:`memory_figure` (measured peaks),
  :func:`residual_growth_figure`, :func:`scaling_figure` (time and memory against T) (``costs``)
- attention during training: :class:`ProbeHistory` (``probe_history``), its figures
  (``evolution``) and its viewer (``evolution_viewer``); head pruning (``pruning``); head roles
  (:func:`head_roles_figure`, ``roles``), heads as low-rank relations (:func:`head_spectrum_figure`:
  singular values and effective rank of every head's QK/OV circuit, ``spectrum``), the viewer
  (``viewer``: :func:`view` shows it inline in a notebook; it opens on :func:`most_informative_head`,
  ``viewer_start``; :func:`add_mixing` adds its method switch, ``viewer_mixing``; :func:`add_lens`
  its lens panel, ``viewer_lens``)

- activation patching and direct logit attribution: :func:`patching_figure` (layers × heads or
  layers × positions), :func:`attribution_figure` (the top heads' direct part in a logit)
  (``patching``)

Every figure is a :class:`Plot` (the figure and the arrays it drew); :func:`save_figure` writes
PNG or SVG.
"""

from attnlab.viz._draw import Plot, save_figure
from attnlab.viz.alignment import alignment_heatmap
from attnlab.viz.approximations import approximation_error_figure, approximation_inputs
from attnlab.viz.attention import (
    Reduced,
    attention_heatmap,
    head_grid,
    layer_head_grid,
    reduce_attention,
)
from attnlab.viz.costs import flops_figure, memory_figure, residual_growth_figure, scaling_figure
from attnlab.viz.evolution import attention_evolution, head_entropy_curves, row_entropy
from attnlab.viz.evolution_viewer import viewer_data_from_history
from attnlab.viz.fonts import FontChoice, font_for
from attnlab.viz.lessons import mask_panel, noam_curve, positional_encoding_figure, token_masks
from attnlab.viz.patching import attribution_figure, patching_figure
from attnlab.viz.probe_history import ProbeHistory
from attnlab.viz.roles import head_roles_figure
from attnlab.viz.scaling import (
    SoftmaxScaling,
    softmax_jacobian_norm,
    softmax_scaling_figure,
    softmax_scaling_stats,
)
from attnlab.viz.spectrum import head_spectrum_figure
from attnlab.viz.steps import step_panel, step_panel_from_model, step_panel_from_module
from attnlab.viz.steps_by_hand import load_step_inputs, step_panel_by_hand
from attnlab.viz.training import label_smoothing_figure, training_curves
from attnlab.viz.viewer import (
    AttentionGroup,
    AttentionLayer,
    Viewer,
    ViewerData,
    render_viewer,
    view,
    viewer_data,
    write_viewer,
)
from attnlab.viz.viewer_lens import LensView, add_lens
from attnlab.viz.viewer_mixing import MixingView, add_mixing
from attnlab.viz.viewer_start import ViewerStart, most_informative_head

__all__ = [
    "AttentionGroup",
    "AttentionLayer",
    "FontChoice",
    "LensView",
    "MixingView",
    "Plot",
    "ProbeHistory",
    "Reduced",
    "SoftmaxScaling",
    "Viewer",
    "ViewerData",
    "ViewerStart",
    "add_lens",
    "add_mixing",
    "alignment_heatmap",
    "approximation_error_figure",
    "approximation_inputs",
    "attention_evolution",
    "attention_heatmap",
    "attribution_figure",
    "flops_figure",
    "font_for",
    "head_entropy_curves",
    "head_grid",
    "head_roles_figure",
    "head_spectrum_figure",
    "label_smoothing_figure",
    "layer_head_grid",
    "load_step_inputs",
    "mask_panel",
    "memory_figure",
    "most_informative_head",
    "noam_curve",
    "patching_figure",
    "positional_encoding_figure",
    "reduce_attention",
    "render_viewer",
    "residual_growth_figure",
    "row_entropy",
    "save_figure",
    "scaling_figure",
    "softmax_jacobian_norm",
    "softmax_scaling_figure",
    "softmax_scaling_stats",
    "step_panel",
    "step_panel_by_hand",
    "step_panel_from_model",
    "step_panel_from_module",
    "token_masks",
    "training_curves",
    "view",
    "viewer_data",
    "viewer_data_from_history",
    "write_viewer",
]
