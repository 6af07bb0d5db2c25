"""The generated tiny Llama: loadable, shaped like its config, built once, peaked logits."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pdbench.config.schema import ModelConfig
from pdbench.driver.tiny_model import (
    BOS_ID,
    EOS_ID,
    MARKER,
    UNK_ID,
    ensure_tiny_model,
    is_built,
    resolve_model_path,
    tiny_model_dir,
)

pytestmark = pytest.mark.unit

PRESET = Path(__file__).resolve().parents[2] / "conf" / "model" / "tiny_llama.yaml"


def preset_model() -> ModelConfig:
    """conf/model/tiny_llama.yaml on its schema, without Hydra."""
    data = OmegaConf.load(PRESET)
    data.pop("defaults")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), data))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[ModelConfig, Path, Path]:
    model = preset_model()
    cache = tmp_path_factory.mktemp("cache")
    return model, cache, ensure_tiny_model(model, cache)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_loads_with_transformers_and_matches_the_config(built):
    from transformers import AutoConfig, AutoTokenizer

    model, _, path = built
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert (path / name).exists(), name
    hf = AutoConfig.from_pretrained(path)
    assert hf.model_type == "llama"
    assert hf.num_hidden_layers == model.num_layers
    assert hf.hidden_size == model.hidden_size
    assert hf.num_attention_heads == model.num_attention_heads
    assert hf.num_key_value_heads == model.num_kv_heads
    assert hf.head_dim == model.resolved_head_dim
    assert hf.intermediate_size == model.intermediate_size
    assert hf.vocab_size == model.vocab_size
    assert hf.max_position_embeddings == model.max_model_len
    assert str(hf.dtype).removeprefix("torch.") == model.dtype
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == model.vocab_size
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (UNK_ID, BOS_ID, EOS_ID)
    ids = list(range(3, 13))
    assert tok(tok.decode(ids), add_special_tokens=False)["input_ids"] == ids  # round trip


def test_weights_have_the_configured_shapes_and_dtype(built):
    from safetensors import safe_open

    model, _, path = built
    kv = model.num_kv_heads * model.resolved_head_dim
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        dtype = f.get_slice("lm_head.weight").get_dtype()
    assert shapes["model.embed_tokens.weight"] == (model.vocab_size, model.hidden_size)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (kv, model.hidden_size)
    assert shapes["lm_head.weight"] == (model.vocab_size, model.hidden_size)
    assert sum(".self_attn.q_proj." in k for k in shapes) == model.num_layers
    assert dtype == "F32"


def test_second_call_reuses_the_build(built):
    model, cache, path = built
    before = (path / MARKER).stat().st_mtime_ns, (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(model, cache) == path
    after = (path / MARKER).stat().st_mtime_ns, (path / "model.safetensors").stat().st_mtime_ns
    assert before == after
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp dirs left


def test_dir_is_keyed_by_shape_and_seed_not_built_by_lookup(built):
    model, cache, path = built
    assert tiny_model_dir(model, cache) == path
    assert tiny_model_dir(replace(model, name=model.name), cache) == path
    other = tiny_model_dir(replace(model, seed=1), cache)
    assert other != path and not other.exists()
    assert tiny_model_dir(replace(model, num_layers=3), cache) != path


def test_concurrent_builds_agree_and_are_deterministic(built, tmp_path):
    model, _, path = built
    results: list[Path] = []
    errors: list[BaseException] = []

    def build():
        try:
            results.append(ensure_tiny_model(model, tmp_path))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(results)) == 1 and is_built(results[0])
    assert [p.name for p in results[0].parent.iterdir()] == [results[0].name]
    for name in ("model.safetensors", "tokenizer.json"):  # same seed, same bytes
        assert sha(results[0] / name) == sha(path / name), name


def test_resolve_model_path(built, tmp_path):
    model, cache, path = built
    assert resolve_model_path(model, cache) == str(path)
    served = replace(model, generate=False, path="/models/llama")
    assert resolve_model_path(served, tmp_path) == "/models/llama"
    assert not (tmp_path / "tiny_models").exists()


def test_greedy_top1_margin_is_well_above_float_noise(built):
    import torch
    from transformers import AutoModelForCausalLM

    model, _, path = built
    net = AutoModelForCausalLM.from_pretrained(path).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.vocab_size, (2, 256), generator=g)
    with torch.no_grad():
        logits = net(ids).logits.float()
    top2 = logits.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).flatten()
    assert margin.median().item() > 0.1
    assert (margin < 1e-3).float().mean().item() < 0.01


def test_import_stays_light():
    code = (
        "import sys, pdbench.driver.tiny_model, jobs.tracking, pdbench.validate.rules; "
        "print(sorted(m for m in ('torch', 'transformers', 'wandb', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
