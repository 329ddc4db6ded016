"""attnlab.viz — figures (matplotlib) and the self-contained HTML attention viewer."""

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
    "ViewerData",
    "render_viewer",
    "viewer_data",
    "write_viewer",
]
