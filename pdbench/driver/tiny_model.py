"""A tiny random-weight Llama and its tokenizer, generated locally: nothing from a hub.

``ensure_tiny_model(model, cache_dir)`` builds ``<cache_dir>/tiny_models/<name>-<key>`` once,
keyed by a hash of the shape, dtype and seed (and ``BUILD_VERSION``), as a Hugging Face
directory vLLM and ``transformers`` load: ``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``. It is built in a
temporary directory beside the target and renamed into place, so concurrent callers (several
tasks of one job) either win the rename or find the finished directory.

Weights: normal(0, ``INITIALIZER_RANGE``) from a seeded generator of our own (norm scales 1),
large enough that logits are peaked (top-1 margins around 1 logit) and outputs do not loop,
so greedy decoding does not flip on float noise between flows.

Tokenizer: a ``tokenizers`` WordLevel model trained on a generated corpus of
``vocab_size - 3`` made-up words, ids 0-2 being ``<unk> <s> </s>`` (the load generator
draws prompt ids from 3 up).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from pdbench.config.schema import ModelConfig, RunConfig
from pdbench.traffic.words import made_up_words

BUILD_VERSION = 2  # bump when the build changes: old directories are then ignored
INITIALIZER_RANGE = 0.5
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
MARKER = "pdbench_tiny_model.json"  # written last before the rename: a finished build
TORCH_DTYPES = {
    "auto": "float32",
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
}
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }} {% endfor %}"


def model_key(model: ModelConfig) -> dict[str, object]:
    """What the generated files depend on (the name is only a label)."""
    return {
        "build_version": BUILD_VERSION,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": model.resolved_head_dim,
        "intermediate_size": model.intermediate_size,
        "vocab_size": model.vocab_size,
        "max_model_len": model.max_model_len,
        "dtype": TORCH_DTYPES.get(model.dtype, model.dtype),
        "seed": model.seed,
    }


def tiny_model_dir(model: ModelConfig, cache_dir: str | Path) -> Path:
    """Where ``ensure_tiny_model`` puts this model (built or not)."""
    text = json.dumps(model_key(model), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Path(cache_dir).expanduser() / "tiny_models" / f"{model.name}-{digest}"


def is_built(path: Path) -> bool:
    return (path / MARKER).exists()


def ensure_tiny_model(model: ModelConfig, cache_dir: str | Path) -> Path:
    """The generated model's directory, built first if it is not there yet."""
    target = tiny_model_dir(model, cache_dir)
    if is_built(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build_tokenizer(model, tmp)
        build_weights(model, tmp)
        (tmp / MARKER).write_text(json.dumps(model_key(model), indent=1, sort_keys=True))
        _share(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_built(target):  # not a finished build by a concurrent caller
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _share(path: Path) -> None:
    """Modes as a plain mkdir/open would give (mkdtemp and some writers use 0700/0600)."""
    umask = _umask()
    path.chmod(0o777 & ~umask)
    for child in path.iterdir():
        child.chmod(0o666 & ~umask)


def resolve_model_path(model: ModelConfig, cache_dir: str | Path) -> str:
    """What the servers load: ``model.path``, or the generated model (built on demand)."""
    if model.generate:
        return str(ensure_tiny_model(model, cache_dir))
    return model.path


def model_path_for(cfg: RunConfig, create: bool) -> str:
    """The served model's directory; the tiny model is generated (once) when ``create``."""
    if create or not cfg.model.generate:
        return resolve_model_path(cfg.model, cfg.cache_dir)
    return str(tiny_model_dir(cfg.model, cfg.cache_dir))


def build_tokenizer(model: ModelConfig, out_dir: Path) -> None:
    """A WordLevel tokenizer of exactly ``vocab_size`` tokens, trained on generated text."""
    from tokenizers import (  # lazy: only when the tiny model is built
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )

    words = made_up_words(model.vocab_size - len(SPECIAL_TOKENS), model.seed)
    # Word k appears (n - k) times: the trainer's frequency order is the list's order.
    corpus = (" ".join([w] * (len(words) - k)) for k, w in enumerate(words))
    tok = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS[UNK_ID]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces, streams well
    trainer = trainers.WordLevelTrainer(
        vocab_size=model.vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != model.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, not {model.vocab_size}")
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[UNK_ID],
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "model_max_length": model.max_model_len,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def build_weights(model: ModelConfig, out_dir: Path) -> None:
    """Seeded random Llama weights in the config's dtype, saved as safetensors."""
    import torch  # lazy: torch only when the tiny model is built
    from transformers import (  # lazy: only when the tiny model is built
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )
    from transformers.utils import logging as hf_logging  # lazy: only when the model is built

    dtype = getattr(torch, TORCH_DTYPES.get(model.dtype, model.dtype))
    config = LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_kv_heads,
        head_dim=model.resolved_head_dim,
        max_position_embeddings=model.max_model_len,
        initializer_range=INITIALIZER_RANGE,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        net = LlamaForCausalLM(config).eval()
    # Weights from a generator of our own, in a fixed order: the same bytes for a seed in
    # any thread or process, whatever transformers' own initialisation does.
    gen = torch.Generator().manual_seed(model.seed)
    with torch.no_grad():
        for _, param in sorted(net.named_parameters()):
            if param.ndim == 1:  # RMSNorm scales
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * INITIALIZER_RANGE)
    net = net.to(dtype)
    net.config.dtype = dtype
    net.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        net.save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
