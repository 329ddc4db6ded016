"""The ASGI app of ``attnlab serve``: a JSON API over one :class:`~attnlab.serve.session.Session`
and the page that uses it (static assets shipped in the package; nothing from the network).

Endpoints (``POST`` takes and answers JSON; each request names its tokens by ``text`` or by
``ids``, with ``prompt_length`` where generated tokens follow the prompt):

=====================  ==========================================================================
``GET /``              the page
``GET /static/NAME``   its assets, and the viewer's ``viewer.css``
``GET /api/info``      the model's layers, heads, context and the server's ``max_tokens``
``POST /api/tokenize`` ``ids`` and ``tokens`` of a text
``POST /api/attention`` the viewer's JSON payload (every layer and head, base64 float32)
``POST /api/view``     the viewer page (``attnlab view``'s HTML) for the iframe, with the tokens
``POST /api/share``    the same page as a download (``attnlab-view.html``)
``POST /api/steps``    one head step by step, ``layer``, ``head``, ``query`` (``plot steps``)
``POST /api/card``     the head's card, ``layer``, ``head``, ``query``: role scores, entropy and
                       sink share, QK/OV spectra, context mixing, logit lens (``parts``: some of
                       them; :mod:`attnlab.serve.card`)
``POST /api/next``     the next token's distribution under ``temperature``, ``top_k``, ``top_p``
``POST /api/generate`` ``n`` sampled tokens with ``seed`` (as ``attnlab generate --seed``) and
                       their probabilities (``scores``; the view labels them p%)
=====================  ==========================================================================

A bad request gets a 4xx JSON answer ``{"error": message, "field": name}`` — never a 500 with a
traceback: a body that is not UTF-8 JSON (400), a body over :data:`MAX_BODY_BYTES` (413), a field
out of range (422), a text or a sequence past the stated limits (413). A ``Host`` header that is
not the server's own is refused (400; DNS rebinding). The server reads no path a page sends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from torch import nn

from attnlab._checks import check_seed
from attnlab.errors import AttnlabError
from attnlab.models.transformer import Transformer
from attnlab.serve.card import CARD_PARTS, head_card
from attnlab.serve.requests import (
    FieldError,
    check_count,
    check_ids,
    check_index,
    check_text,
    sampling,
)
from attnlab.serve.seq2seq import Seq2SeqSession, Target
from attnlab.serve.session import DEFAULT_MAX_TOKENS, Session
from attnlab.tasks.figures import viewer_for
from attnlab.tasks.lm import LMIO
from attnlab.tasks.seq2seq import Seq2SeqIO
from attnlab.viz.viewer import render_viewer

__all__ = ["MAX_BODY_BYTES", "create_app"]

logger = logging.getLogger(__name__)

#: the largest request body read (bytes): a longer one is refused with 413 before it is parsed
MAX_BODY_BYTES = 1_000_000
#: the most tokens ``/api/generate`` adds in one request
MAX_GENERATE = 64
#: the most next tokens ``/api/next`` lists
MAX_TOP = 100
#: the static files the page loads
_STATIC = {"serve.js": "text/javascript", "serve.css": "text/css"}
_CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-src 'self' blob:; base-uri 'none'; "
    "form-action 'none'"
)

Handler = Callable[[Session, dict[str, Any]], Any]


def create_app(
    model: nn.Module,
    tokenizer: Any = None,
    *,
    io: Seq2SeqIO | None = None,
    title: str = "attnlab",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    eos_id: int | None = None,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]"),
) -> Starlette:
    """The ``attnlab serve`` app for one loaded language model or encoder-decoder.

    Args:
        model: an :class:`attnlab.GPT`, or an :class:`attnlab.Transformer` with ``io`` (put in
            eval mode).
        tokenizer: a GPT's tokenizer (``encode``, ``decode``; ``None``: ids only).
        io: an encoder-decoder's text path (the run's :class:`~attnlab.tasks.seq2seq.Seq2SeqIO`,
            ``load_run(...).io``): its requests are served by
            :mod:`attnlab.serve.seq2seq`.
        title: the page's title.
        max_tokens: the longest sequence (prompt and generated tokens) a request may run;
            at most the model's context. Default :data:`~attnlab.serve.session.DEFAULT_MAX_TOKENS`.
        eos_id: generation stops after this token (a pretrained model's end token), or ``None``.
        hosts: the ``Host`` names the server answers (any port); another is refused.

    Returns:
        A Starlette app (serve it with uvicorn, or test it with ``TestClient``).

    Raises:
        TypeError: ``model`` is neither a language model with a ``config.n_positions`` nor
            an encoder-decoder with its ``io``.
        ValueError: ``max_tokens`` is not a positive int.
    """
    from attnlab.errors import ArgumentError, ArgumentTypeError

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ArgumentError(f"max_tokens must be a positive int, got {max_tokens!r}")
    session: Session
    n_positions = getattr(getattr(model, "config", None), "n_positions", None)
    if isinstance(io, Seq2SeqIO) and isinstance(model, Transformer):
        session = Seq2SeqSession(model, io, title, max_tokens)  # type: ignore[arg-type]
    elif isinstance(model, nn.Module) and isinstance(n_positions, int) and io is None:
        session = Session(model, LMIO(tokenizer, n_positions, eos_id=eos_id), title, max_tokens)
    else:
        raise ArgumentTypeError(
            "model must be a language model (attnlab.GPT), or an encoder-decoder "
            f"(attnlab.Transformer) with its io (a Seq2SeqIO), got {type(model).__name__} and "
            f"io {type(io).__name__}"
        )
    seq2seq = isinstance(session, Seq2SeqSession)

    def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                body = await _json_body(request)
                result = await run_in_threadpool(handler, session, body)
            except FieldError as exc:
                return _error(exc.status, str(exc), exc.field)
            except AttnlabError as exc:  # the library's own refusal of an input
                return _error(422, str(exc), None)
            except Exception:  # a bug: logged with its traceback, answered without it
                logger.exception("attnlab serve: internal error on %s", request.url.path)
                return _error(500, "internal error (logged by the server; a bug in attnlab)")
            if isinstance(result, Response):
                return result
            return JSONResponse(result)

        return endpoint

    async def info(request: Request) -> Response:
        return JSONResponse(session.info())

    handlers: dict[str, Handler] = {
        "tokenize": _tokenize, "attention": _attention, "view": _view, "share": _share,
        "steps": _steps, "card": _card, "next": _next, "generate": _generate,
    }  # fmt: skip
    if seq2seq:  # the encoder-decoder's own; the step panel and the card are a GPT's
        handlers = {**dict.fromkeys(handlers, _lm_only), **SEQ2SEQ_HANDLERS}
    routes = [
        Route("/", _index),
        Route("/static/{name}", _static),
        Route("/api/info", info),
        *(Route(f"/api/{name}", api(h), methods=["POST"]) for name, h in handlers.items()),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.session = session
    return app


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, refused (4xx) when too long, not UTF-8 or not an object."""
    if request.method != "POST":
        return {}
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise FieldError("body", f"the request has {length} bytes, more than {MAX_BODY_BYTES}", 413)
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise FieldError("body", f"the request has more than {MAX_BODY_BYTES} bytes", 413)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FieldError(
            "body", f"the request is not valid UTF-8 (byte {exc.start})", 400
        ) from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FieldError("body", f"the request is not JSON: {exc.msg} at {exc.pos}", 400) from None
    except RecursionError:  # arrays nested deeper than Python's parser goes
        raise FieldError("body", "the request's JSON is nested too deeply", 400) from None
    if not isinstance(body, dict):
        raise FieldError(
            "body", f"the request must be a JSON object, got {type(body).__name__}", 400
        )
    return body


# ---------------------------------------------------------------------- what each endpoint reads
def _ids(session: Session, body: dict[str, Any]) -> tuple[list[int], int | None]:
    """The request's tokens (``text`` or ``ids``) and ``prompt_length`` (``None``: all prompt)."""
    if ("text" in body) == ("ids" in body):
        raise FieldError("text", "send text (a string) or ids (token ids), one of them")
    if "text" in body:
        ids = session.encode(check_text(body["text"]))
    else:
        ids = check_ids(body["ids"], session.vocab_size)
        session.check_length(ids, "ids")
    prompt = body.get("prompt_length")
    if prompt is not None:
        prompt = check_count(body, "prompt_length", 1, len(ids), len(ids))
    return ids, prompt


def _tokens(session: Session, ids: list[int], prompt: int | None) -> dict[str, Any]:
    return {"ids": ids, "tokens": session.labels(ids), "prompt_length": prompt}


def _keep(session: Session, body: dict[str, Any]) -> tuple[int, int] | None:
    if body.get("layer") is None or body.get("head") is None:
        return None
    layer = check_index(body, "layer", len(session.layers))
    heads = session.info()["heads"][layer]
    return layer, check_index(body, "head", heads)


def _tokenize(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, prompt = _ids(session, body)
    return _tokens(session, ids, prompt)


def _attention(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, prompt = _ids(session, body)
    data = session.viewer(ids, prompt, _keep(session, body))
    return {**_tokens(session, ids, prompt), "viewer": data.to_json()}


def _view(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, prompt = _ids(session, body)
    data = session.viewer(ids, prompt, _keep(session, body))
    start = data.to_json()["start"] if data.start is None else data.start.to_json()
    return {**_tokens(session, ids, prompt), "start": start, "html": render_viewer(data)}


def _share(session: Session, body: dict[str, Any]) -> Response:
    ids, prompt = _ids(session, body)
    page = render_viewer(session.viewer(ids, prompt, _keep(session, body)))
    return HTMLResponse(
        page, headers={"Content-Disposition": 'attachment; filename="attnlab-view.html"'}
    )


def _steps(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, _ = _ids(session, body)
    layer, head = _keep(session, {"layer": 0, "head": 0, **body}) or (0, 0)
    query = check_index(body, "query", len(ids), len(ids) - 1)
    figure = body.get("figure", False)
    if not isinstance(figure, bool):
        raise FieldError("figure", f"figure must be true or false, got {figure!r}")
    return session.steps(ids, layer, head, query, figure=figure)


def _card(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, _ = _ids(session, body)
    layer, head = _keep(session, {"layer": 0, "head": 0, **body}) or (0, 0)
    query = check_index(body, "query", len(ids), len(ids) - 1)
    parts = body.get("parts", list(CARD_PARTS))
    if not isinstance(parts, list) or not all(p in CARD_PARTS for p in parts):
        raise FieldError(
            "parts", f"parts must be a list of {', '.join(CARD_PARTS)}, got {str(parts)[:40]}"
        )
    return head_card(session, ids, layer, head, query, parts)


def _next(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, _ = _ids(session, body)
    chosen = sampling(body, session.vocab_size)
    top = check_count(body, "top", 1, MAX_TOP, 10)
    return session.next_token(ids, chosen, top)


def _generate(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    ids, prompt = _ids(session, body)
    chosen = sampling(body, session.vocab_size)
    n = check_count(body, "n", 1, MAX_GENERATE, 1)
    seed = body.get("seed", 0)
    try:
        seed = check_seed("seed", seed)
    except AttnlabError as exc:
        raise FieldError("seed", str(exc)) from None
    out = session.generate(ids, n, seed, chosen)
    start = len(ids) if prompt is None else prompt
    scores = [s.to_json() for s in session.scores_of(out, start)]
    return {**_tokens(session, out, start), "new": out[len(ids) :],
            "text": session.io.decode(out), "scores": scores}  # fmt: skip


def _lm_only(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    raise FieldError("text", "this endpoint shows a language model's heads; this server runs "
                     "an encoder-decoder (its attention, next token and decoding are served)")  # fmt: skip


def _seq2seq(session: Session) -> Seq2SeqSession:
    if not isinstance(session, Seq2SeqSession):  # pragma: no cover - routed by kind
        raise FieldError("text", "not an encoder-decoder")
    return session


def _target(session: Seq2SeqSession, body: dict[str, Any]) -> Target:
    return session.read(body, check_text(body.get("text")))


def _s2s_view(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    session = _seq2seq(session)
    t = _target(session, body)
    inputs = session.model_inputs(t)
    data = viewer_for(inputs, session.attention(t), session.title)  # its most informative head
    payload = data.to_json()
    return {**session.tokens(t), "start": payload["start"], "html": render_viewer(data),
            "viewer": payload}  # fmt: skip


def _s2s_next(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    session = _seq2seq(session)
    t = _target(session, body)
    chosen = sampling(body, session.vocab_size)
    return session.next_target(t, chosen, check_count(body, "top", 1, MAX_TOP, 10))


def _s2s_generate(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    session = _seq2seq(session)
    t = _target(session, body)
    n = check_count(body, "n", 1, MAX_GENERATE, 1)
    out = session.decode(t, n)
    return {**session.tokens(out), "new": list(out.target[len(t.target) :])}


def _s2s_tokenize(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    session = _seq2seq(session)
    return session.tokens(_target(session, body))


SEQ2SEQ_HANDLERS: dict[str, Handler] = {
    "tokenize": _s2s_tokenize, "view": _s2s_view, "next": _s2s_next, "generate": _s2s_generate,
}  # fmt: skip


# ---------------------------------------------------------------------- the page
def _asset(name: str) -> str:
    return resources.files("attnlab.serve").joinpath("static", name).read_text(encoding="utf-8")


async def _index(request: Request) -> Response:
    return HTMLResponse(_asset("index.html"), headers={"Content-Security-Policy": _CSP})


async def _static(request: Request) -> Response:
    name = request.path_params["name"]
    if name == "viewer.css":  # the viewer's own styles, shared rather than copied
        text = resources.files("attnlab.viz").joinpath("templates", "viewer.css")
        return Response(text.read_text(encoding="utf-8"), media_type="text/css")
    if name not in _STATIC:  # a fixed list: no path from the request is ever opened
        return _error(404, f"no static file {name!r}")
    return Response(_asset(name), media_type=_STATIC[name])
