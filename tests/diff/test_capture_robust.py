"""A recording never breaks the run it watches: a tensor with no data keeps its shape, a dump that cannot be
written stops the recording (once, with a warning) while the model runs on, and every hook is removed."""

from __future__ import annotations

import json

import pytest
import torch

from npu_port.attn import watch
from npu_port.diff import Dump, capture
from npu_port.diff.dump import DumpWriter


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x, extra=None):
        return self.b(torch.relu(self.a(x)))


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_meta_tensor_argument_keeps_its_shape_and_says_why_it_was_not_read(tmp_path):
    model = Net()
    with capture(model, tmp_path / "run.d") as c:
        model(torch.randn(2, 4), extra=torch.empty(3, 5, device="meta"))
    assert c.complete
    records = list(Dump(tmp_path / "run.d").records())
    meta = [r for r in records if r["name"] == "kwargs.extra"]
    assert len(meta) == 1 and meta[0]["shape"] == [3, 5] and meta[0]["dtype"] == "float32"
    assert meta[0]["unreadable"].startswith(("NotImplementedError", "RuntimeError"))
    assert all("unreadable" not in r for r in records if r is not meta[0])


def test_a_dump_that_cannot_be_written_stops_recording_not_the_run(tmp_path, monkeypatch):
    model = Net()
    expected = model(torch.ones(2, 4))
    written = []
    original = DumpWriter.add

    def add(self, record, full=None):
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        written.append(record["seq"] if "seq" in record else None)
        return original(self, record, full)

    monkeypatch.setattr(DumpWriter, "add", add)
    with pytest.warns(UserWarning, match=r"^npu-port diff: recording stopped \(OSError: \[Errno 28\] No space left"):
        with capture(model, tmp_path / "run.d") as c:
            out = model(torch.ones(2, 4))
            again = model(torch.ones(2, 4))
    assert torch.equal(out, expected) and torch.equal(again, expected)
    assert not c.complete and c.failure.startswith("OSError")
    index = json.loads((tmp_path / "run.d" / "index.json").read_text())
    assert index["complete"] is False and index["records"] == 3 and index["meta"]["failure"] == c.failure
    assert _hooks(model) == 0 and watch.WATCHERS == []


class CfgModel(torch.nn.Module):
    """Called as DiT's sample.py calls its model: through a method that calls ``self.forward``, not ``__call__``."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def forward_with_cfg(self, x):
        return self.forward(torch.cat([x, x]))


def test_a_process_capture_names_modules_from_their_topmost_parent(tmp_path):
    """``target=None`` (``npu-port run --dump``): blocks reached without their parent's ``__call__`` are named under
    the parent (``CfgModel.blocks.1``), not as roots of their own (``Linear#1``); every hook goes with the block."""
    from torch.nn.modules import module as torch_module

    model = CfgModel()
    before = len(torch_module._global_forward_pre_hooks)
    with capture(None, tmp_path / "run.d"):
        model.forward_with_cfg(torch.randn(1, 4))
        model.forward_with_cfg(torch.randn(1, 4))
    records = list(Dump(tmp_path / "run.d").records())
    names = sorted({(r["module"], r["call"]) for r in records})
    assert names == [("CfgModel.blocks.0", 0), ("CfgModel.blocks.0", 1), ("CfgModel.blocks.1", 0),
                     ("CfgModel.blocks.1", 1)]  # fmt: skip
    assert _hooks(model) == 0 and len(torch_module._global_forward_pre_hooks) == before


class AttentionNet(torch.nn.Module):
    """Calls ``npu_port.attention`` as the drop-ins and patched legacy attention do (the process-wide path)."""

    def forward(self, q, k, v):
        import npu_port

        out = npu_port.attention(q, k, v, is_causal=True)
        out2, lse = npu_port.attention(q, k, v, return_lse=True)
        return out + out2


def test_calls_through_npu_port_attention_are_recorded_with_their_module(tmp_path):
    model = AttentionNet()
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    with capture(model, tmp_path / "run.d"):
        out = model(q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = expected + torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected)  # recording changes nothing
    calls = [r for r in Dump(tmp_path / "run.d").records() if r["kind"] == "attention"]
    assert {(r["module"], r["call"], r["io"], r["name"]) for r in calls} == {
        ("(model)", 0, "in", "query"), ("(model)", 0, "in", "key"), ("(model)", 0, "in", "value"),
        ("(model)", 0, "out", "out"), ("(model)", 1, "in", "query"), ("(model)", 1, "in", "key"),
        ("(model)", 1, "in", "value"), ("(model)", 1, "out", "out"), ("(model)", 1, "out", "lse"),
    }  # fmt: skip
    assert calls[0]["class"] == "attention(is_causal=True, scale=None)" and watch.WATCHERS == []
