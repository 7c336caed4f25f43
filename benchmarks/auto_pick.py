"""Does ``auto`` pick the fastest correct kernel? For every bench shape: auto's pick within 5% of the best.

The acceptance target: for every ``npu-port bench`` shape, the kernel auto picks (fresh router, disk cache off) is
no more than 5% slower than the fastest candidate that gives the right answer, both measured in the same run.

Method, in one process, per shape:

1. The candidates are the strategy's own kernels, configured as auto configures them. Each is asked for its reasons,
   refused when its score tensor would exceed auto's memory budget, and run on auto's parity slice (batch 0, up to
   2 heads, the first rows) against a float64 reference: the rest are the *correct candidates*.
2. The correct candidates are timed *interleaved* (``npu_port.device.timing.Rounds``): after a warm-up, round-robin
   over the kernels for ``--rounds`` rounds (the order rotated each round), one synchronised call each per round,
   median and middle half (inclusive quartiles, as auto's) per kernel. On a small, shared machine (this project's
   2-core CPU) load comes and goes over seconds; timing kernels one after another lets a burst land on one kernel
   only, interleaving spreads it over all of them. Half the rounds run before auto is asked and half after, so drift
   between the two phases shows up in both.
3. ``--trials`` fresh routers (``cache=False``) each decide the shape; the ratio
   ``median(auto's pick) / median(fastest correct)`` is taken from step 2's numbers, not from auto's own probe.
   Pass: every trial's ratio <= ``--threshold`` (1.05).

    python benchmarks/auto_pick.py                         # the device's default bench shapes -> benchmarks/results/
    python benchmarks/auto_pick.py --shapes all --device cuda --dtype float16
    python benchmarks/auto_pick.py --quick --out /tmp/r    # tiny shapes, seconds (what the test runs)

The exit code is 1 when a shape fails the target. Rounds are capped by ``--seconds-per-shape`` (at least 3 rounds),
so large shapes on slow devices stay bounded.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from npu_port.bench.results import machine_info
from npu_port.bench.runner import Settings, make_call, reference, resolve_device, resolve_dtype
from npu_port.bench.shapes import parse_shapes
from npu_port.device import free_memory_bytes
from npu_port.device.timing import Rounds, timed
from npu_port.strategy.measure import TOLERANCE, parity_slice
from npu_port.strategy.registry import get_strategy
from npu_port.strategy.router import FREE_MEMORY_SHARE, StrategyRouter

QUICK_SHAPES = "custom:1,2,64,16,custom:1,4,256,32"


def _budget(strategy, device: torch.device) -> Optional[int]:
    """auto's memory budget, by auto's own rule (the strategy's, else a share of the free memory)."""
    budget = strategy.option("memory_budget")
    if budget is None:
        free = free_memory_bytes(device)
        budget = int(free * FREE_MEMORY_SHARE) if free else None
    return budget


def candidates(strategy, call, ref, device) -> Dict[str, Dict[str, Any]]:
    """Every candidate's status: refused (reasons), rejected (parity / error), or correct (with the kernel)."""
    router = StrategyRouter(strategy.with_overrides(cache=False))
    budget = _budget(strategy, device)
    found: Dict[str, Dict[str, Any]] = {}
    for configured in router.kernels:
        kernel, reasons = router._forms(configured, call)  # the compute_dtype form, exactly as auto would run it
        if not reasons and budget is not None and kernel.score_bytes(call) > budget:
            reasons = [f"would materialise {kernel.score_bytes(call) / 2**20:.0f} MiB of scores, over the budget"]
        if reasons:
            found[kernel.name] = {"status": "refused", "reasons": reasons}
            continue
        try:
            with torch.no_grad():
                out = kernel.run(parity_slice(call, strategy.option("parity_rows")))  # auto's slice, as auto checks
            finite = bool(torch.isfinite(out).all())
            error, relative = ref.error(out)
            del out
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a finding, like auto's own rejection
            found[kernel.name] = {"status": "rejected", "reasons": [f"{type(exc).__name__}: {exc}"]}
            continue
        tolerance = max(TOLERANCE.get(call.dtype, 3e-4), TOLERANCE.get(getattr(kernel, "dtype", call.dtype), 0.0))
        if not finite or relative > tolerance:
            found[kernel.name] = {"status": "rejected", "reasons": [f"max error {error:.2e} > {tolerance:.0e}"]}
            continue
        found[kernel.name] = {"status": "correct", "kernel": kernel, "parity_max_abs_error": error}
    return found


def check_shape(strategy, shape, settings, rounds, trials, seconds, threshold) -> Dict[str, Any]:
    device = settings.device
    call = make_call(shape, settings)
    ref = reference(call, strategy.option("parity_rows"))
    found = candidates(strategy, call, ref, device)
    correct = {name: entry["kernel"] for name, entry in found.items() if entry["status"] == "correct"}
    row: Dict[str, Any] = {"shape": shape.name, "dims": shape.describe(), "candidates": {}, "trials": []}
    if not correct:
        row.update(passed=False, problem="no correct candidate")
        return row

    # warm-up (also estimates one round's time, to cap the rounds)
    with torch.no_grad():
        _, round_s = timed(lambda: [kernel.run(call) for kernel in correct.values()], device)
    rounds = max(3, min(rounds, int(seconds / max(round_s, 1e-9))))
    # interleaved: one synchronised run of each kernel per round, the order rotated each round
    timing = Rounds(list(correct.values()), lambda kernel: timed(functools.partial(kernel.run, call), device)[1])
    with torch.no_grad():
        timing.run(rounds - rounds // 2)

    for _ in range(trials):
        router = StrategyRouter(strategy.with_overrides(cache=False))
        with torch.no_grad():
            picked, probe_s = timed(functools.partial(router.select, call), device)
        pick = picked.name
        decision = next(iter(router.decisions.values()))
        row["trials"].append(
            {
                "pick": pick,
                "probe_s": probe_s,
                "auto_medians_ms": {c.kernel: c.median_s * 1e3 for c in decision.candidates if c.median_s is not None},
                "auto_runs": {c.kernel: c.runs for c in decision.candidates if c.median_s is not None},
            }
        )
        del router

    with torch.no_grad():
        timing.run(rounds // 2)

    spreads = dict(zip(correct, timing.spreads()))
    medians = {name: summary.median for name, summary in spreads.items()}
    fastest = min(medians, key=medians.get)
    for name, entry in found.items():
        out = {k: v for k, v in entry.items() if k != "kernel"}
        if name in spreads:
            summary = spreads[name]
            out.update(
                median_ms=summary.median * 1e3, p25_ms=summary.low * 1e3, p75_ms=summary.high * 1e3, runs=summary.runs
            )
        row["candidates"][name] = out
    for trial in row["trials"]:
        trial["ratio"] = medians[trial["pick"]] / medians[fastest] if trial["pick"] in medians else None
    ratios = [t["ratio"] for t in row["trials"]]
    row.update(
        rounds=rounds,
        fastest=fastest,
        fastest_ms=medians[fastest] * 1e3,
        worst_ratio=None if None in ratios else max(ratios),
        passed=None not in ratios and max(ratios) <= threshold,
    )
    return row


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="auto", help="a 'measure' strategy or profile (default: auto)")
    parser.add_argument("--shapes", help="as npu-port bench --shapes (default: the device's default bench shapes)")
    parser.add_argument("--device", help="cpu, cuda, npu (default: as npu-port bench)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved timing rounds per shape (default 21)")
    parser.add_argument("--seconds-per-shape", type=float, default=60.0, help="caps the rounds (at least 3)")
    parser.add_argument("--trials", type=int, default=3, help="fresh auto routers asked per shape (default 3)")
    parser.add_argument("--threshold", type=float, default=1.05, help="largest allowed pick/fastest ratio")
    parser.add_argument("--quick", action="store_true", help=f"tiny shapes ({QUICK_SHAPES}), 5 rounds, 1 trial")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    settings = Settings(device=device, dtype=resolve_dtype(args.dtype))
    if args.quick:
        args.shapes, args.rounds, args.trials = args.shapes or QUICK_SHAPES, min(args.rounds, 5), 1
    shapes, skipped = parse_shapes(args.shapes, device.type)
    strategy = get_strategy(args.strategy)
    if strategy.select != "measure":
        parser.error(f"--strategy {args.strategy} selects by {strategy.select!r}; this benchmark checks 'measure'")

    rows = []
    for shape in shapes:
        row = check_shape(strategy, shape, settings, args.rounds, args.trials, args.seconds_per_shape, args.threshold)
        rows.append(row)
        cands = ", ".join(
            f"{n} {c['median_ms']:.3f}" if "median_ms" in c else f"{n} {c['status']}"
            for n, c in row["candidates"].items()
            if c["status"] != "refused"
        )
        picks = ", ".join(f"{t['pick']} ({t['ratio']:.3f})" if t["ratio"] else t["pick"] for t in row["trials"])
        verdict = "PASS" if row["passed"] else "FAIL"
        print(f"{shape.name:>18}: {verdict}  fastest {row.get('fastest')}  [{cands} ms]  auto picked: {picks}")
    for name, why in skipped:
        print(f"{name:>18}: skipped ({why})")

    result = {
        "benchmark": "auto_pick",
        "target": f"auto's pick within {(args.threshold - 1) * 100:.0f}% of the fastest correct candidate",
        "command": "python " + " ".join(["benchmarks/auto_pick.py"] + (sys.argv[1:] if argv is None else argv)),
        "strategy": {"name": strategy.name, "candidates": list(strategy.candidates), "options": dict(strategy.options)},
        "config": {
            "device": str(device),
            "dtype": args.dtype,
            "rounds": args.rounds,
            "seconds_per_shape": args.seconds_per_shape,
            "trials": args.trials,
            "threshold": args.threshold,
            "auto_repeats": strategy.option("repeats"),
            "auto_warmup": strategy.option("warmup"),
            "auto_probe_seconds": strategy.option("probe_seconds"),
        },
        "machine": machine_info(device),
        "skipped_shapes": [{"shape": n, "reason": r} for n, r in skipped],
        "shapes": rows,
        "passed": all(r["passed"] for r in rows),
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"auto_pick_{device.type}_{args.dtype}{'_quick' if args.quick else ''}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"{'PASS' if result['passed'] else 'FAIL'}; wrote {path}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
