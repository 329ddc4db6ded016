"""``attnlab serve``: a live explorer with one model running behind it.

:func:`create_app` builds the ASGI app (Starlette; serve it with uvicorn, test it with
``TestClient``): a JSON API over one loaded language model — the attention of every layer and
head, one head step by step, the next token's distribution under temperature, top-k and top-p,
generation under a seed — and the page that uses it. Every number comes from the library's own
functions (capture, the step panel, the sampler, ``generate``); see
:mod:`attnlab.serve.session` and :mod:`attnlab.serve.app`.
"""

from attnlab.serve.app import create_app

__all__ = ["create_app"]
