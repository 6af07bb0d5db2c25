"""pdbench's configuration tree (Hydra's config dir), shipped as package data, and the one
reader of its named model shapes for code that does not compose configs (the analysis's
what-if: ``model=llama3_70b``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MODEL_DIR = Path(__file__).resolve().parent / "model"


def model_sections(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every ``model/*.yaml`` as a mapping, by file stem (``name`` defaulting to it); files
    that are not a mapping are left out. The caller decides what a full shape is
    (``records.model.ModelShape.from_dict``)."""
    folder = folder or MODEL_DIR
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            out[path.stem] = {"name": path.stem, **data}
    return out
