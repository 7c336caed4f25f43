"""``npu-port diff`` on a transformers text encoder folder (``config.json``, no ``model_index.json``): loaded with
``AutoModel``, fixed token ids when no tokenizer is saved, every module recorded and compared."""

from __future__ import annotations

import json

import pytest
import torch

from npu_port.cli.main import main
from npu_port.diff import Dump


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> str:
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=32)  # fmt: skip
    folder = tmp_path_factory.mktemp("encoder") / "clip-text"
    CLIPTextModel(config).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_text_encoder_is_dumped_and_compared(encoder_dir, tmp_path, capsys):
    out = tmp_path / "enc.d"
    argv = ["diff", "dump", "--model", encoder_dir, "--device", "cpu", "--strategy", "vanilla", "-o", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    dump = Dump(out)
    assert dump.meta["kind"] == "text-encoder" and dump.meta["tokens"] == [list(range(1, 17))]
    modules = {r["module"] for r in dump.records()}
    prefix = "text_model." if "text_model" in modules else ""  # transformers 5's CLIPTextModel has no text_model
    assert {"(model)", f"{prefix}encoder.layers.0.self_attn", f"{prefix}final_layer_norm"} <= modules
    capsys.readouterr()
    assert main(["diff", str(out), "--b", "strategy=sdpa", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["first_divergence"] is None
    assert main(["diff", str(out), "--b", "dtype=bfloat16", "--json", "--tolerance", "1e-6", "--no-progress"]) == 1
    first = json.loads(capsys.readouterr().out)["first_divergence"]
    assert first["module"] in modules - {"(model)"} and first["origin"] is True
