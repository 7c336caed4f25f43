"""Start the Gradio demo: ``python scripts/gradio_demo_npu.py`` or ``python -m npu_port.demo``.

    python scripts/gradio_demo_npu.py                       # tiny model (random weights), http://127.0.0.1:7860
    python scripts/gradio_demo_npu.py --model ./sd-pipeline --dtype float16 --strategy sdpa
    python scripts/gradio_demo_npu.py --host 0.0.0.0 --port 0 --max-side 1024 --max-steps 50 --request-timeout 60

The model is loaded once, at start. Requests go through a queue with one slot: users wait in turn and never run the
model in parallel on the one device. The queue is bounded (``--max-queue`` waiting, ``--per-client`` waiting or
running per client), and a request whose client has left stops at its next step. What one request may cost is
bounded: the model's size and steps limits (the same as ``npu-port infer``'s; ``--max-side`` / ``--max-steps`` can
only lower them), a time limit per request (``--request-timeout``), and uploads of at most ``MAX_UPLOAD_BYTES`` (the
demo takes no files). Exit code 2 with one line for bad input (gradio missing, an unknown strategy, a limit the
model does not allow, a host or port the server cannot listen on, a model that cannot be loaded), all but the last
found before the model loads.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, List, Optional

from .address import MAX_PORT
from .admission import DEFAULT_MAX_QUEUE, DEFAULT_PER_CLIENT
from .app import PROG


class _Parser(argparse.ArgumentParser):
    """argparse whose error is one line and exit code 2 (without the usage block, which hides the line that
    matters), as ``npu-port``'s own parser does."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.splitlines())}\n")


def _port(text: str) -> int:
    """``--port``: a whole number from 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_PORT} (or 0: any free port), got {text!r}"
        )
    return port


def _whole(text: str) -> int:
    """A count (``--max-queue``, ``--per-client``): a whole number; its range is :class:`QueueLimits`'s to check."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from ..infer.models import DTYPES
    from .form import DEFAULT_REQUEST_TIMEOUT

    parser = _Parser(
        prog=PROG,
        description="A local web demo of a diffusers pipeline on this machine's device: pick an attention strategy, "
        "generate (time per step, resolved strategy, peak memory), compare strategies side by side. The model is "
        "loaded once; requests queue and run one at a time.",
    )
    parser.add_argument(
        "--model", default="tiny", help="'tiny' (default), 'tiny-dit', a pipeline directory or a hub id"
    )
    parser.add_argument("--device", default=None, help="npu, cuda, xpu, mps or cpu (default: the best usable device)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on cpu, float16 elsewhere")
    parser.add_argument("--strategy", default="auto", help="the strategy selected at start (default: auto)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    parser.add_argument("--port", type=_port, default=7860, help="port (default 7860; 0: any free port)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    parser.add_argument(
        "--max-side", type=int, default=None, help="largest height/width (default and upper bound: the model's limit)"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="most steps (default and upper bound: the model's limit)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help=f"stop a request (a Generate or a whole Compare) that runs longer (default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-queue",
        type=_whole,
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help=f"requests that may wait in the queue; one more is refused (default {DEFAULT_MAX_QUEUE})",
    )
    parser.add_argument(
        "--per-client",
        type=_whole,
        default=DEFAULT_PER_CLIENT,
        metavar="N",
        help=f"requests one client (a page, an API client) may have waiting or running (default {DEFAULT_PER_CLIENT})",
    )
    return parser.parse_args(argv)


def free_port(host: str) -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host if host not in ("", "0.0.0.0") else "127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check_images(model: str, kind: Any) -> None:
    """The demo shows images: a video model is refused with one line pointing to ``npu-port infer``."""
    from ..errors import InferenceError
    from ..infer.limits import TEXT_TO_VIDEO

    if kind == TEXT_TO_VIDEO:
        raise InferenceError(
            f"{model!r} is a text-to-video model and the demo shows images; run it with npu-port infer --model {model}"
        )


def prepare(args: argparse.Namespace, *, listen: bool = False) -> Any:
    """Load the model once and build the queued demo (not launched). ``listen``: also check, before the load, that
    the server can listen on ``--host`` / ``--port`` (what :func:`main` does; a test that only builds need not)."""
    from ..device import device_name, get_device
    from ..infer import load_pipeline
    from ..infer.deadline import check_timeout
    from ..infer.models import describe_model, resolve_dtype
    from ..infer.paths import cache_location
    from .address import check_listen
    from .admission import QueueLimits
    from .app import build_demo
    from .choices import check_strategy, strategy_choices

    # everything that can be checked is checked before the (possibly long) model load
    check_timeout(args.request_timeout, "--request-timeout")
    queue_limits = QueueLimits(args.max_queue, args.per_client)
    model = describe_model(args.model)
    _check_images(args.model, model.kind)
    if model.limits is not None:  # a hub id's limits are known once it is loaded (build_demo checks them then)
        model.limits.lowered(max_side=args.max_side, max_steps=args.max_steps)
    choices = strategy_choices()
    check_strategy(args.strategy, choices)
    device = get_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    cache, warning = cache_location()  # NPU_PORT_CACHE_DIR unwritable: an error; the default one: a warning
    if warning:
        print(f"{PROG}: {warning}", file=sys.stderr, flush=True)
    if listen:  # last: what is checked above does not depend on which ports are free on this machine
        check_listen(args.host, args.port)
    print(
        f"{PROG}: loading {args.model!r} on {device} ({device_name(device)}), {str(dtype).replace('torch.', '')}",
        flush=True,
    )
    loaded = load_pipeline(
        args.model,
        device,
        dtype,
        progress_bar=False,
        on_build=lambda message: print(f"{PROG}: {message}", file=sys.stderr, flush=True),
        cache=cache,
    )
    _check_images(args.model, loaded.kind)  # a hub id's kind is known once it is loaded
    demo = build_demo(
        loaded,
        max_side=args.max_side,
        max_steps=args.max_steps,
        strategy=args.strategy,
        choices=choices,
        request_timeout=args.request_timeout,
        queue_limits=queue_limits,
    )
    return demo


def main(argv: Optional[List[str]] = None) -> int:
    from ..errors import NpuPortError
    from .app import MAX_UPLOAD_BYTES, require_gradio

    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no usage reports from a lab machine by default
    try:
        require_gradio()  # fail before loading the model
        demo = prepare(args, listen=True)
    except NpuPortError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    port = args.port or free_port(args.host)
    try:
        _, local_url, share_url = demo.launch(
            server_name=args.host,
            server_port=port,
            share=args.share,
            prevent_thread_lock=True,
            quiet=True,
            max_file_size=MAX_UPLOAD_BYTES,  # the demo takes no files: refuse uploads beyond a few bytes
        )
    except OSError as exc:
        print(f"{PROG}: cannot listen on {args.host}:{port}: {exc} (try --port 0 for any free port)", file=sys.stderr)
        return 2
    print(f"{PROG}: running on {local_url}", flush=True)
    if share_url:
        print(f"{PROG}: public link {share_url}", flush=True)
    print(f"{PROG}: press Ctrl+C to stop", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
