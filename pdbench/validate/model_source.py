"""Where a server finds its weights: a directory, or a Hugging Face hub id and its cache.

vLLM takes ``--model`` as a directory or a hub id. A hub id is fetched into the hub cache
(``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``) as ``models--<org>--<name>/snapshots/<revision>/``; with
``HF_HUB_OFFLINE=1`` nothing is downloaded and the cache must already hold it. Pure: the
environment and home directory are arguments; callers decide which environment applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TRUE_WORDS = ("1", "true", "yes", "on")


def is_local_path(path: str) -> bool:
    """A directory (absolute, relative or ``~``) rather than a hub id like ``org/name``."""
    return path.startswith(("/", ".", "~"))


def hub_offline(env: Mapping[str, str]) -> bool:
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_WORDS


@dataclass(frozen=True)
class HubCache:
    path: Path
    explicit: bool  # set by HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME, not the home default
    source: str  # the variable it comes from, or "~/.cache"


def hub_cache(env: Mapping[str, str], home: str) -> HubCache:
    """The hub cache a process with environment ``env`` and home ``home`` reads."""
    if env.get("HF_HUB_CACHE"):
        return HubCache(Path(env["HF_HUB_CACHE"]).expanduser(), True, "HF_HUB_CACHE")
    if env.get("HF_HOME"):
        return HubCache(Path(env["HF_HOME"]).expanduser() / "hub", True, "HF_HOME")
    if env.get("XDG_CACHE_HOME"):
        return HubCache(Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub", True, "XDG_CACHE_HOME")
    return HubCache(Path(home) / ".cache" / "huggingface" / "hub", False, "~/.cache")


def hub_repo_dir(cache: Path, model_id: str) -> Path:
    """``<cache>/models--org--name``: where the hub keeps ``org/name``."""
    return cache / ("models--" + model_id.replace("/", "--"))


def hub_snapshots(cache: Path, model_id: str) -> list[Path]:
    """Downloaded revisions of ``model_id`` in ``cache`` (empty: not there)."""
    snapshots = hub_repo_dir(cache, model_id) / "snapshots"
    try:
        return sorted(p for p in snapshots.iterdir() if p.is_dir())
    except OSError:
        return []


def weights_in(directory: Path) -> list[Path]:
    """Weight files of a model directory (safetensors, or PyTorch bins)."""
    try:
        files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    except OSError:
        return []
    return files
