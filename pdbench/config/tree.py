"""What the Hydra tree under ``conf/`` offers, read from its files (no Hydra, no composing).

The help page and the override check both list groups and presets from here, so neither
can drift from the files: a preset is ``conf/<group>/<name>.yaml``; the schemas Hydra
also lists as choices (``base_<group>``, from the ConfigStore) are not presets. A preset's
summary is the first sentence of its header comment (an experiment's ``Question:`` line).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # as cli's config_path
ROOT_CONFIG = "config"
_SENTENCE_END = re.compile(r"(?<=[.?])\s")


def groups(conf: Path = CONF_DIR) -> dict[str, list[str]]:
    """Every config group and its presets, sorted (groups with no file are left out)."""
    out = {}
    for folder in sorted(p for p in conf.iterdir() if p.is_dir() and not p.name.startswith("_")):
        names = sorted(f.stem for f in folder.glob("*.yaml"))
        if names:
            out[folder.name] = names
    return out


def default_choices(conf: Path = CONF_DIR) -> dict[str, str | None]:
    """The groups ``config.yaml`` picks (group -> preset; ``None`` for an ``optional`` one)."""
    root = yaml.safe_load((conf / f"{ROOT_CONFIG}.yaml").read_text()) or {}
    out: dict[str, str | None] = {}
    for entry in root.get("defaults", []):
        if not isinstance(entry, dict):
            continue
        for key, value in entry.items():
            if key.startswith("override "):
                continue
            if key.startswith("optional "):
                out[key.removeprefix("optional ")] = None
            else:
                out[key] = str(value)
    return out


def header_comment(path: Path) -> list[str]:
    """The comment lines a YAML file starts with, ``# @package`` lines left out."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].removeprefix(" ")
        if not text.startswith("@package"):
            lines.append(text)
    return lines


def summary(path: Path) -> str:
    """A preset's ``Question:`` sentence, else the first sentence of its header comment."""
    prose = []
    for text in header_comment(path):
        if not text.strip() or text.startswith(" "):  # an example command ends the prose
            break
        prose.append(text.strip())
    joined = " ".join(prose)
    start = joined.find("Question:")
    if start >= 0:
        joined = joined[start + len("Question:") :].strip()
    return _SENTENCE_END.split(joined, maxsplit=1)[0] if joined else ""
