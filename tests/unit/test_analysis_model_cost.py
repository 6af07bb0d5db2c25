"""First-principles numbers against hand-computed ones, and the what-if calculator."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from analysis import whatif
from analysis.method.model_cost import ModelShape, known_shapes
from analysis.method.predict import first_principles_saving, predicted_crossover
from analysis.method.saving_curve import Shape

pytestmark = pytest.mark.unit

LLAMA_8B = {
    "name": "llama3_8b",
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "dtype": "bfloat16",
}


def test_llama31_8b_by_hand():
    s = ModelShape.from_dict(LLAMA_8B)
    # KV: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes
    assert s.kv_bytes_per_token == 131072
    # a layer: q 4096*4096 + k, v 4096*1024 each + o 4096*4096 + MLP 3*4096*14336 = 218,103,808
    assert s.layer_matmul_params == 218_103_808
    # + 2 norms per layer, final norm, embedding and LM head 128256*4096 each
    assert s.params == 32 * (218_103_808 + 2 * 4096) + 4096 + 2 * 128256 * 4096
    assert s.params == 8_030_261_248
    assert s.params == pytest.approx(8.03e9, rel=1e-3)
    assert s.flops_per_token(0) == 2 * 32 * 218_103_808 == 13_958_643_712
    # attention: QK^T and AV, 2 * 4096 FLOPs per earlier token each, 32 layers
    assert s.flops_per_token(1000) - s.flops_per_token(0) == 4 * 32 * 4096 * 1000
    # two tokens: 2 x linear + the second one's attention to the first + one LM head
    assert s.prefill_flops(2) == 2 * 13_958_643_712 + 4 * 32 * 4096 + 2 * 128256 * 4096
    assert s.prefill_flops(2, start=10) - s.prefill_flops(2) == 4 * 32 * 4096 * 20
    assert s.prefill_flops(0) == 0


def test_head_dim_defaults_and_builtin_shapes():
    tiny = ModelShape.from_dict({**LLAMA_8B, "hidden_size": 128, "num_attention_heads": 4,
                                 "head_dim": 0, "num_kv_heads": 2, "num_layers": 2,
                                 "dtype": "float32"})  # fmt: skip
    assert tiny.head_dim == 32 and tiny.kv_bytes_per_token == 1024
    assert known_shapes()["llama3_70b"].kv_bytes_per_token == 327680  # 320 KiB
    assert known_shapes()["llama3_70b"].params == pytest.approx(70.55e9, rel=1e-3)
    assert known_shapes()["llama3_8b"] == ModelShape.from_dict(LLAMA_8B)
    with pytest.raises(ValueError, match="lacks"):
        ModelShape.from_dict({"name": "x", "num_layers": 2})


def test_known_shapes_reads_conf_model(tmp_path):
    shapes = known_shapes()  # the checkout's conf/model
    assert {"tiny_llama", "llama3_8b", "llama3_70b"} <= set(shapes)
    assert shapes["tiny_llama"].head_dim == 32 and shapes["tiny_llama"].dtype == "float32"
    (tmp_path / "mine.yaml").write_text(
        "defaults: [base_model, _self_]\nname: mine\nnum_layers: 4\nhidden_size: 256\n"
        "num_attention_heads: 4\nnum_kv_heads: 4\nhead_dim: 0\nintermediate_size: 512\n"
        "vocab_size: 1000\ndtype: float16\n"
    )
    (tmp_path / "partial.yaml").write_text("name: partial\n")
    shapes = known_shapes(tmp_path)
    assert shapes["mine"].kv_bytes_per_token == 2 * 4 * 4 * 64 * 2
    assert set(shapes) == {"mine"}  # conf/model only: no shape written anywhere else


def test_model_shapes_are_written_in_conf_model_only():
    """The analysis and the synthetic runs take their shapes from conf/model (issue 14)."""
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "analysis").glob("*.py")):
        found = re.findall(
            r"(?:num_kv_heads|intermediate_size)[\"']?\s*[:=]\s*\d", path.read_text()
        )
        assert not found, f"{path.name} writes a model shape: {found}"


def test_first_principles_crossover_matches_the_closed_form():
    s = ModelShape.from_dict(LLAMA_8B)
    flops, bw, alpha = 1.4e14, 1e9, 2e-3  # ~10k tok/s prefill, a slow 8 Gbit/s link
    linear, attn = s.flops_per_token(0) / flops, 4 * 32 * 4096 / flops
    # (linear h + attn h (h - 1) / 2) - (alpha + h kv / bw) = 0
    a, b, c = attn / 2, linear - attn / 2 - s.kv_bytes_per_token / bw, -alpha
    root = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    assert 16_000 < root < 20_000  # per token: compute 99.7 us vs pull 131 us; attention wins
    got = predicted_crossover(first_principles_saving(s, flops, bw, alpha))
    assert got.shape is Shape.CROSSING and got.tokens == pytest.approx(root, rel=1e-6)


def test_whatif_parse_units_and_errors():
    w, at = whatif.parse(["model=llama3_70b", "bandwidth_gbps=400", "prefill_tok_s=3000"])
    assert w.bandwidth_bytes_per_s == 50e9 and at == [1024, 8192, 32768]
    assert w.flops_per_s == pytest.approx(3000 * w.shape.flops_per_token(0))
    w2, _ = whatif.parse(["model=llama3_8b", "bandwidth_gb_s=25", "prefill_tok_s=1e4",
                          "alpha_ms=2", "kv_dtype=fp8", "at=100,200"])  # fmt: skip
    assert w2.bandwidth_bytes_per_s == 25e9 and w2.alpha_s == pytest.approx(2e-3)
    assert w2.shape.kv_bytes_per_token == 65536
    for bad, msg in (
        (["model=nope", "bandwidth_gbps=1", "prefill_tok_s=1"], "unknown"),
        (["model=llama3_8b", "prefill_tok_s=1"], "bandwidth"),
        (["model=llama3_8b", "bandwidth_gbps=1"], "prefill_tok_s"),
        (["model=llama3_8b", "speed=1"], "bad argument"),
    ):
        with pytest.raises(ValueError, match=msg):
            whatif.parse(bad)


def test_whatif_report_and_speedups(capsys):
    args = ["model=llama3_8b", "bandwidth_gbps=25", "prefill_tok_s=20000", "alpha_ms=2"]
    assert whatif.main(args) == 0
    out = capsys.readouterr().out
    assert "predicted crossover: pull beats recompute above" in out
    assert "131,072 bytes/token" in out and "8.03 Gparams" in out
    w, at = whatif.parse(args)
    speedups = np.array([w.recompute_s(h) / w.pull_s(h) for h in at])
    assert np.all(np.diff(speedups) > 0)  # the longer the history, the more pulling pays
    for h, sp in zip(at, speedups, strict=True):
        assert f"{h:>9,}" in out and f"{sp:>6.2f}x" in out
    assert whatif.main(["model=llama3_8b"]) == 2


BASE = ["model=llama3_8b", "bandwidth_gbps=25", "prefill_tok_s=20000"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["bandwidth_gbps=nan"], "bandwidth_gbps given twice"),
        (["alpha_ms=-1"], r"alpha_ms=-1 must be a finite number >= 0"),
        (["alpha_ms=nan"], r"alpha_ms=nan must be a finite number >= 0"),
        (["new_tokens=-5"], r"new_tokens=-5 must be a finite number > 0"),
        (["new_tokens=2.5"], "new_tokens=2.5 must be a whole number"),
        (["overhead_ms=inf"], "overhead_ms=inf must be a finite number >= 0"),
        (["at=100,-3"], "at: -3 must be a whole number of tokens > 0"),
        (["at=,"], "at= lists no history length"),
        (["alpha_ms=1", "alpha_ms=2"], "alpha_ms given twice"),
        (["bandwidth_gb_s=3"], "give one of bandwidth_gbps"),
        (["kv_dtype=int3"], "kv_dtype=int3: unknown KV dtype 'int3'; known: bf16"),
    ],
)
def test_whatif_rejects_bad_inputs_naming_the_argument(extra, message, capsys):
    with pytest.raises(ValueError, match=message):
        whatif.parse(BASE + extra)
    assert whatif.main(BASE + extra) == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "abc"])
def test_whatif_bandwidth_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match="bandwidth_gbps="):
        whatif.parse(["model=llama3_8b", "prefill_tok_s=1000", f"bandwidth_gbps={value}"])
    with pytest.raises(ValueError, match="prefill_tok_s="):
        whatif.parse(["model=llama3_8b", "bandwidth_gbps=10", f"prefill_tok_s={value}"])


def test_whatif_shows_how_the_crossover_moves_with_alpha(capsys):
    assert whatif.main([*BASE, "alpha_ms=2"]) == 0
    out = capsys.readouterr().out
    table = out.split("how the crossover moves with alpha")[1].splitlines()[2:]
    alphas = [float(line.split()[0]) for line in table]
    assert alphas == [0.0, 1.0, 2.0, 4.0, 10.0] and "<- given" in table[2]
    w, _ = whatif.parse([*BASE, "alpha_ms=2"])
    tokens = [whatif.crossover_at(w, a / 1e3).tokens for a in alphas[1:]]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]  # a dearer pull pays later
    assert "pull faster at every length" in table[0]  # no fixed cost: pulling always pays
