"""``npu_port.activate(...)``: make a CUDA project run here, unchanged — what ``npu-port run`` does first.

In order: the profile's Ascend options (a dry run off an NPU), the cuda -> device redirect, the flash_attn / xformers
drop-ins (a real, working package wins unless forced), the compiled-extension fallbacks (RAFT's ``alt_cuda_corr``),
the process-wide attention strategy (what the drop-ins and patched legacy attention call), the profile's
``safe_math`` (float32 autocast, TF32 off), diffusers' ``enable_xformers_memory_efficient_attention`` hook (when
the project imports diffusers, not before: importing it ourselves costs seconds, and diffusers imports xformers —
the drop-in — as soon as it looks available), and an import watcher over the project's own modules that, as each
is imported, rewrites its device-type checks (:mod:`.device_checks`), routes its legacy attention classes and
applies the user's ``overrides`` — and that hands transformers' and diffusers' loader classes to the redirect as
their modules are imported (their ``from_pretrained`` then gets its ``device_map`` on the target).
:meth:`Activation.deactivate` undoes all of it in reverse order; :meth:`Activation.summary` says what was installed
and how often each piece was used.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

logger = logging.getLogger("npu_port.run")


@dataclass
class Activation:
    """Everything :func:`activate` installed, and how to take it back."""

    device: Any
    strategy: Any  # the StrategyHandle
    redirect: Any
    npu_options: Optional[Any] = None
    dropins: List[str] = field(default_factory=list)
    fallbacks: List[str] = field(default_factory=list)
    legacy_classes: List[str] = field(default_factory=list)
    safe_math: Optional[Dict[str, bool]] = None  # what the profile's safe_math forced, if anything
    watched_roots: List[str] = field(default_factory=list)
    device_checks: Optional[Any] = None  # the DeviceChecks rewriting the project's device-type checks
    overrides: Optional[Any] = None  # the Overrides applied as their modules are imported
    watcher: Optional[Any] = None  # the ImportWatcher over the project's modules
    _undo: List[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def transform(self) -> Optional[Callable[..., Any]]:
        """What compiles the project's own files (the entry script too): the device-check rewrite, if on."""
        return self.device_checks.transform if self.device_checks is not None else None

    @property
    def init_globals(self) -> Dict[str, Any]:
        """Globals the rewritten entry point needs."""
        from .device_checks import HELPER

        return {HELPER: self.device_checks} if self.device_checks is not None else {}

    def summary(self) -> Dict[str, Any]:
        """Device, strategy, and for every piece what was patched and how often it was hit (JSON-ready)."""
        from ..dropins.finder import registered
        from ..dropins.flash_attn_npu import ROUTES
        from ..integrations.legacy_attention import hooked_routes
        from ..strategy.tally import TALLY
        from ..upstream import declines
        from .handled import by_library, by_rule

        served = {name: list(r.served) for name, r in registered().items() if r.served}
        importers = {name: dict(r.imported_by) for name, r in registered().items() if r.served}
        reasons = {name: r.reason for name, r in registered().items() if r.served and r.reason}
        routes = [route for route in TALLY.routes() if route["calls"]]
        calls = TALLY.calls()
        hits = self._hits()
        return {
            "device": str(self.device),
            "strategy": {
                "requested": self.strategy.strategy.name,
                "resolved": "+".join(calls) if calls else self.strategy.name,  # most used first
            },
            "attention_calls": calls,
            "attention_routes": routes,
            "redirect": {"target": str(self.redirect.target), "hits": self.redirect.hits()},
            "drop_ins": {
                "installed": list(self.dropins),
                "served": {k: v for k, v in served.items() if k in self.dropins},
                "imported_by": {k: v for k, v in importers.items() if k in self.dropins},
            },
            "flash_attn_npu": ROUTES.summary(),
            "fallbacks": {
                "installed": list(self.fallbacks),
                "served": {k: v for k, v in served.items() if k in self.fallbacks},
                "imported_by": {k: v for k, v in importers.items() if k in self.fallbacks},
                "why": {k: v for k, v in reasons.items() if k in self.fallbacks},
            },
            "legacy_attention_classes": list(self.legacy_classes),
            "enable_xformers_routed": hooked_routes(),
            "project": {
                "watched_roots": list(self.watched_roots),
                "modules": list(self.watcher.watched) if self.watcher is not None else [],
            },
            "device_checks": self.device_checks.summary() if self.device_checks is not None else None,
            "overrides": self.overrides.summary() if self.overrides is not None else [],
            "safe_math": self.safe_math,
            "npu_options": self.npu_options.as_dict() if self.npu_options is not None else None,
            "by_rule": by_rule(hits),
            "by_library": by_library(hits),
            "declines": [decline.as_dict() for decline in declines()],
        }

    def _hits(self) -> List[Tuple[str, Any]]:
        """``(mechanism, hit snapshot)`` of every piece that counts what it handled (see :mod:`.handled`)."""
        from ..dropins.finder import registered
        from ..dropins.install import CALLS, XFORMERS_CALLS
        from ..integrations.legacy_attention import hook_hits
        from . import handled

        log = self.redirect.hit_log()
        sources = [(handled.REDIRECT, log.snapshot() if log is not None else None)]
        served_by = {"flash_attn": handled.FLASH_ATTN_DROPIN, "xformers": handled.XFORMERS_DROPIN}
        for name, replacement in registered().items():
            if name in self.dropins or name in self.fallbacks:
                sources.append((served_by.get(name, handled.FALLBACK), replacement.log.snapshot()))
        sources.append((handled.FLASH_ATTN_DROPIN, CALLS.snapshot()))
        sources.append((handled.XFORMERS_DROPIN, XFORMERS_CALLS.snapshot()))
        hook = hook_hits()
        sources.append((handled.XFORMERS_HOOK, hook.snapshot() if hook is not None else None))
        if self.device_checks is not None:
            sources.append((handled.DEVICE_CHECKS, handled.device_check_hits(self.device_checks.summary())))
        return sources

    def format_summary(self) -> str:
        from .handled import format_by_rule

        data = self.summary()
        hits = ", ".join(f"{k} x{v}" for k, v in sorted(data["redirect"]["hits"].items())) or "none"
        served = []
        for kind in ("drop_ins", "fallbacks"):
            for name in data[kind]["served"]:
                importer = data[kind]["imported_by"][name].get(name)
                served.append(f"{name} (imported by {importer})" if importer else name)
        lines = [
            f"npu-port run: device {data['device']}; attention strategy {data['strategy']['requested']} "
            f"-> {data['strategy']['resolved']} ({_format_calls(data['attention_calls'], data['attention_routes'])})",
            f"  cuda redirect hits: {hits}",
            f"  stand-ins served: {', '.join(served) or 'none'}",
            f"  legacy attention classes routed: {', '.join(data['legacy_attention_classes']) or 'none'}",
        ]
        for item in data["enable_xformers_routed"]:
            lines.append(f"  {item['object']}.enable_xformers_memory_efficient_attention() -> {item['routed']}")
        checks = data["device_checks"]
        if checks:
            lines.append(f"  device-type checks that see {data['device']} as cuda ({len(checks)}):")
            lines += [f"    {c['rule']} {c['module']}:{c['line']}: {c['code']}  (x{c['hits']})" for c in checks]
        for item in data["overrides"]:
            state = "applied" if item["applied"] else "NOT applied: the module was never imported"
            lines.append(f"  override {item['target']} -> {item['replacement']}: {state}")
        lines += _format_flash_attn_routes(data["flash_attn_npu"])
        if data["npu_options"] is not None:
            mode = "dry run" if data["npu_options"]["dry_run"] else "applied"
            lines.append(f"  Ascend options ({mode}): {len(data['npu_options']['actions'])} settings")
        lines += format_by_rule(data["by_rule"], libraries=data["by_library"])
        lines += [f"  not routed: {decline['message']}" for decline in data["declines"]]
        return "\n".join(lines)

    def deactivate(self) -> None:
        """Undo everything, last installed first; safe to call twice."""
        while self._undo:
            self._undo.pop()()


def _format_calls(calls: Dict[str, int], routes: List[Dict[str, Any]]) -> str:
    """The attention calls per kernel, and through what they ran unless all through the process-wide strategy:
    ``sdpa x381 via Pipe.enable_xformers_memory_efficient_attention()``; per route when several routed calls
    (``sdpa x385: 4 process-wide, 381 via Pipe.enable_xformers_memory_efficient_attention()``)."""
    from ..strategy.tally import PROCESS_WIDE

    text = ", ".join(f"{kernel} x{count}" for kernel, count in sorted(calls.items())) or "none"
    ways = [route["via"] if route["via"] == PROCESS_WIDE else f"via {route['via']}" for route in routes]
    if not routes or ways == [PROCESS_WIDE]:
        return text
    if len(routes) == 1:
        return f"{text} {ways[0]}"
    return f"{text}: " + ", ".join(f"{sum(route['calls'].values())} {way}" for route, way in zip(routes, ways))


def _format_flash_attn_routes(routes: Dict[str, Any]) -> List[str]:
    """The summary's lines on what computed the flash_attn drop-in's calls: none when no call was on an NPU (off an
    NPU the emulation is the only choice; the report still counts those calls under ``device``)."""
    delegated = sum(item["count"] for item in routes["flash_attn_npu"].values())
    emulated = routes["emulation"]
    if not delegated and set(emulated) <= {"device"}:
        return []
    lines = [
        f"  flash_attn drop-in calls: {delegated} by flash_attn_npu, "
        f"{sum(item['count'] for item in emulated.values())} by npu-port's emulation"
    ]
    lines += [f"    emulated, {code} x{item['count']}: {item['reason']}" for code, item in emulated.items()]
    return lines


def diffusers_legacy_classes() -> List[type]:
    """diffusers' own attention classes of the pre-processor era, routed like a project's: 0.11's ``CrossAttention``
    (the legacy ``_attention`` contract) and ``AttentionBlock`` (<= 0.16, inline attention in ``forward``), as the
    diffusers adapter finds them. Newer versions have neither, and are not made to import their attention modules
    for nothing; a version that should have one and does not declines (one warning, listed by ``run --report``)."""
    from ..upstream.diffusers.attention import legacy_classes

    try:
        return legacy_classes()
    except ImportError as exc:  # a diffusers that cannot import its models: the project will say so itself
        logger.warning("npu-port: diffusers' attention classes not routed (%s)", exc)
        return []


def activate(
    device: Any = None,
    strategy: Optional[str] = None,
    profile: Optional[str] = None,
    *,
    watch: Sequence[str] = (),
    force_dropins: bool = False,
    cuda_available: bool = False,
    overrides: Union[Sequence[str], Any] = (),
    device_checks: bool = True,
) -> Activation:
    """Install everything that lets a CUDA-written project run on ``device`` (default: the detected one).

    ``strategy`` (default ``auto``) or ``profile`` (its strategy and its Ascend options); ``watch``: the folders
    holding the project's own modules, which as they are imported get their device-type checks rewritten (unless
    ``device_checks=False``) and their legacy attention classes routed (``npu-port run`` passes the working
    directory, the entry point's folders and ``--watch``); ``overrides``: ``"pkg.mod:func=my_mod:func"`` strings,
    each applied when ``pkg.mod`` is imported (at once if it already is). A failure half-way undoes what was already
    installed.
    """
    from ..device.redirect import redirect_cuda
    from ..dropins.flash_attn_npu import ROUTES
    from ..dropins.install import CALLS, XFORMERS_CALLS, install_dropins, uninstall_dropins
    from ..errors import NpuPortError
    from ..fallbacks.registry import install_builtin_fallbacks, uninstall_builtin_fallbacks
    from ..integrations.legacy_attention import hook_enable_xformers, is_routable_class, patch_legacy_attention
    from ..npu_setup import apply_npu_options
    from ..strategy.api import set_attention_strategy
    from ..strategy.tally import TALLY
    from ..upstream.loaders import MODULES as LOADER_MODULES
    from .device_checks import DeviceChecks
    from .overrides import Overrides
    from .watch_imports import ImportWatcher

    if strategy and profile:
        raise NpuPortError("give a strategy or a profile, not both (a profile names its own strategy)")
    # malformed specs fail before anything is installed (npu-port run parses and checks them itself, earlier)
    requested = overrides if isinstance(overrides, Overrides) else Overrides.parse(overrides)
    undo: List[Callable[[], None]] = []
    try:
        options = apply_npu_options(profile) if profile else None
        if options is not None:
            undo.append(options.restore)
        redirect = redirect_cuda(device, cuda_available=cuda_available).install()
        undo.append(redirect.uninstall)
        dropins = install_dropins(force=force_dropins)
        undo.append(uninstall_dropins)
        CALLS.clear()  # the drop-in calls this run makes (npu-port run --report's NPU110)
        XFORMERS_CALLS.clear()  # and NPU112
        ROUTES.clear()  # and which of them flash_attn_npu computed
        fallbacks = install_builtin_fallbacks()
        undo.append(uninstall_builtin_fallbacks)
        TALLY.open()  # every routed attention call, whatever applies its strategy (the summary's count)
        undo.append(TALLY.close)
        handle = set_attention_strategy(profile or strategy or "auto")
        undo.append(handle.restore)
        safe_math = None
        if handle.strategy.safe_math:  # the profile asks for fp32 / no TF32 (code that hits cuBLAS errors)
            from ..fallbacks.safe_math import force_safe_math

            safe_math = force_safe_math(**handle.strategy.safe_math)
            undo.append(safe_math.restore)
        activation = Activation(redirect.target, handle, redirect, options, list(dropins), list(fallbacks))
        activation.safe_math = dict(handle.strategy.safe_math) if safe_math is not None else None

        def route_class(cls: type) -> None:
            patch = patch_legacy_attention(cls)
            undo.append(patch.restore)
            activation.legacy_classes.append(f"{cls.__module__}.{cls.__qualname__}")

        def route_legacy(module: ModuleType) -> None:
            for value in list(vars(module).values()):
                if isinstance(value, type) and value.__module__ == module.__name__ and is_routable_class(value):
                    route_class(value)

        roots = [os.path.abspath(path) for path in watch]
        activation.watched_roots = roots
        activation.device_checks = DeviceChecks(redirect.target.type) if device_checks and roots else None
        if activation.device_checks is not None:
            undo.append(activation.device_checks.deactivate)
        activation.overrides = requested
        undo.append(requested.restore)

        def hook_diffusers() -> None:  # importing diffusers ourselves would cost seconds and import xformers
            undo.append(hook_enable_xformers())
            for cls in diffusers_legacy_classes():
                route_class(cls)

        def on_import(module: ModuleType) -> None:
            if module.__name__ == "diffusers":
                hook_diffusers()
            elif module.__name__ in LOADER_MODULES:  # from_pretrained gets its device_map on the target
                redirect.serve_loaders()
            requested.on_import(module)
            if activation.watcher is not None and activation.watcher.is_project_file(getattr(module, "__file__", None)):
                route_legacy(module)

        activation.watcher = ImportWatcher(
            roots, on_import, transform=activation.transform, names=[*requested.names, "diffusers", *LOADER_MODULES]
        ).install()
        undo.append(activation.watcher.uninstall)
        if "diffusers" in sys.modules:
            hook_diffusers()
        requested.apply_imported()
    except BaseException:
        while undo:
            undo.pop()()
        raise
    activation._undo = undo
    return activation
