"""MkDocs hooks of the docs site (mkdocs.yml ``hooks``): pages generated from the code.

``reference/configuration.md`` is rendered from the schema's dataclasses and the comments
beside their fields (``pdbench.validate.reference``) on every build, so it is never a copy.
"""

from __future__ import annotations

from mkdocs.structure.files import File, Files


def on_files(files: Files, config) -> Files:
    from pdbench.validate.reference import markdown  # lazy: the build's own interpreter

    files.append(File.generated(config, "reference/configuration.md", content=markdown()))
    return files
