"""``npu-port strategies``: every strategy and profile, whether it can run here (and why not); ``--explain`` applies
one to a tiny diffusers model, runs it, and prints what was decided per attention shape. A strategy file that cannot
be loaded is named with its error on stderr (``"broken"`` in ``--json``) and the rest are still listed."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

from .vocabulary import add_command, add_format, add_verbosity, wants_json

#: Tiny models --explain can build (seeded weights, built from configs: no download).
EXPLAIN_MODELS = ("unet", "dit", "sd3", "flux", "vae")


def add_parser(commands: "argparse._SubParsersAction") -> None:
    parser = add_command(
        commands,
        "strategies",
        help="list attention strategies and profiles; --explain shows auto's measurements",
        example=[
            "npu-port strategies",
            "npu-port strategies --format json",
            "npu-port strategies --show sdpa",
            "npu-port strategies --explain auto --model dit",
        ],
    )
    add_format(parser, help="what to print: text or json (default text; --show prints JSON either way)")
    add_verbosity(parser)
    parser.add_argument(
        "--explain",
        nargs="?",
        const="auto",
        metavar="STRATEGY",
        help="apply STRATEGY (default: auto) to a tiny diffusers model, run it, and explain the decisions",
    )
    parser.add_argument(
        "--model", default="unet", choices=EXPLAIN_MODELS, help="tiny model for --explain (default: unet)"
    )
    parser.add_argument(
        "--show",
        metavar="STRATEGY",
        help="print one strategy's resolved definition (a name, a YAML path or package.module:attr, as --strategy)",
    )


def render(entries: List[Dict[str, Any]], searched: List[str]) -> str:
    lines: List[str] = []
    for kind, title in (("strategy", "Strategies"), ("profile", "Profiles")):
        rows = [e for e in entries if e["kind"] == kind]
        if not rows:
            continue
        lines.append(f"{title}:")
        width = max(len(e["name"]) for e in rows)
        for e in rows:
            state = "yes" if e["available"] else "no "
            lines.append(f"  {e['name']:<{width}}  available: {state}  {e['description']}")
            if e["reasons"] and (not e["available"] or e["select"] != "measure"):
                for kernel, reasons in e["reasons"].items():
                    lines.append(f"  {'':<{width}}    {kernel}: {reasons[0]}")
        lines.append("")
    lines.append("YAML searched: " + ", ".join(searched))
    lines.append(
        "Add your own: a .yaml file in a directory listed in NPU_PORT_STRATEGY_PATH "
        "(every key: docs/reference/strategy-files.md)."
    )
    return "\n".join(lines)


def show(strategy: str) -> str:
    """The definition of ``strategy``, given as every other command takes ``--strategy`` (name, path, import path)."""
    from dataclasses import asdict

    from ..strategy.registry import resolve

    data = asdict(resolve(strategy))
    return json.dumps(data, indent=2, default=str)


def explain(strategy: str, model_name: str) -> str:
    """Apply ``strategy`` to a tiny seeded model, run one forward, and return the handle's explanation."""
    import torch

    from ..integrations.diffusers.tiny import tiny_inputs, tiny_model
    from ..strategy.api import set_attention_strategy
    from ..strategy.registry import resolve

    spec = resolve(strategy)  # a bad name or file is one line before the model is built
    model = tiny_model(model_name)
    inputs = tiny_inputs(model)
    handle = set_attention_strategy(spec, target=model)
    try:
        with torch.no_grad():
            model(**inputs)
        header = f"tiny {model_name} ({type(model).__name__}, random seeded weights), one forward pass"
        return header + "\n" + handle.explain()
    finally:
        handle.restore()


def run(args: argparse.Namespace) -> int:
    import sys

    from ..strategy.registry import searched_locations, survey

    if args.show:
        print(show(args.show))
        return 0
    if args.explain:
        from ..console import for_command

        with for_command(args):  # the libraries' warnings, hidden while the tiny model is built and run
            text = explain(args.explain, args.model)
        print(text)
        return 0
    names, broken = survey()
    for entry in broken:  # one broken file is reported and skipped; the other strategies are still listed
        print(f"npu-port: warning: {entry.describe()}", file=sys.stderr)  # an error for that file: even with -q
    from ..strategy.registry import strategy_entry

    entries = [strategy_entry(name) for name in names]
    if wants_json(args):
        broken_rows = [{"name": b.name, "path": b.path, "error": str(b.error)} for b in broken]
        data = {"strategies": entries, "broken": broken_rows, "searched": searched_locations()}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render(entries, searched_locations()))
    return 0
