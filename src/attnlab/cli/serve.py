"""``attnlab serve MODEL [--port P]`` — a live explorer with the model running behind it.

MODEL is what ``attnlab generate`` takes: a run folder of ``attnlab train lm`` (or a checkpoint),
or a pretrained model (the bundled ``smollm2-135m``, a ``.gguf`` file, a Hugging Face folder or
Hub id). The model is loaded once and served on http://127.0.0.1:PORT (only this machine; the
server answers no other ``Host``, against DNS rebinding). The page shows the attention of every
layer and head for the text typed (the viewer of ``attnlab view``, opening on the most informative
head), one head step by step (``attnlab plot steps``), the next token's probabilities under
temperature, top-k and top-p, generates one or N tokens under a seed (the tokens ``attnlab
generate --seed`` draws) and downloads what it shows as one self-contained HTML file (share).
Nothing is loaded from the network. Requests are served one at a time on the one model.

A sequence (the text and the tokens generated after it) longer than ``--max-tokens`` (default
128; at most the model's context) is refused with a message in the page: the page holds
``layers · heads · T²`` weights (SmolLM2-135M at 128 tokens: about 24 MB). An encoder-decoder
run (``attnlab train translate``, copy, reverse, sort) gets a source and a target box: its encoder
self-, decoder self- and cross-attention, the next target token's probabilities, and "generate N"
decoding greedily as ``attnlab translate`` does (an empty target: the model's own output); the
step panel and the head's card are a language model's. Ctrl-C stops the server.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from attnlab.cli import CLIError
from attnlab.cli._device import device
from attnlab.cli._help import plain
from attnlab.cli.options import add_cache_argument, positive_int

__all__ = ["LOOPBACK", "register", "run"]

#: the names of this machine's loopback interface: the server answers them on any --host
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a port number in [0, 65535], got {text!r}"
        ) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [0, 65535], got {port}")
    return port


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a live explorer in the browser, with the model running behind it",
        description=plain(__doc__),
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="run folder, checkpoint, smollm2-135m, a .gguf file, a Hugging Face folder or Hub id",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; another address "
        "lets anyone who reaches it run the model)",
    )
    p.add_argument(
        "--port", type=_port, default=8000, help="the port (default 8000; 0: any free port)"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=128,
        help="the longest sequence a request may run, text and generated tokens (default 128, "
        "at most the model's context); a longer one is refused with a message in the page",
    )
    p.add_argument("--device", type=device, default="cpu", help="default cpu")
    add_cache_argument(p)
    p.set_defaults(func=run)


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use is one line at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CLIError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CLIError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror}); choose another "
            "--port (0: any free one)"
        ) from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from attnlab.serve import create_app
    except ModuleNotFoundError as exc:
        raise CLIError(f"attnlab serve needs {exc.name}: pip install 'attnlab[serve]'") from None
    from attnlab.tasks.run import load_run

    sock = _listen(args.host, args.port)
    try:
        loaded = load_run(args.model, device=args.device, cache=not args.no_cache)
        io = loaded.io
        hosts = LOOPBACK if args.host in LOOPBACK else (*LOOPBACK, args.host)
        if loaded.is_seq2seq:  # source and target boxes, greedy decoding as translate's
            app = create_app(loaded.model, io=io, title=Path(args.model).name,  # type: ignore[arg-type]
                             max_tokens=args.max_tokens, hosts=hosts)  # fmt: skip
        else:
            app = create_app(
                loaded.model, getattr(io, "tokenizer", None), title=Path(args.model).name,
                max_tokens=args.max_tokens, eos_id=getattr(io, "eos_id", None), hosts=hosts,
            )  # fmt: skip
        session = app.state.session
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        sys.stderr.write(
            f"attnlab serve: {loaded.path.name} on http://{shown}:{port}/ (sequences up to "
            f"{session.max_tokens} tokens; Ctrl-C stops)\n"
        )
        if args.host not in LOOPBACK:
            sys.stderr.write(
                f"attnlab: warning: listening on {args.host}: anyone who reaches it can run the "
                "model\n"
            )
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
