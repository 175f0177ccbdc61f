"""``kvtrim models``: the models kvtrim ships (``--model NAME``) and the GGUF models
LM Studio, Ollama and Hugging Face already downloaded to this computer, each usable
as ``--model PATH``."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..errors import shown
from ..native.embedded import DEFAULT, EMBEDDED
from ..native.finder import default_roots, find_models, format_size


def add_parser(sub: Any) -> None:
    """Registers ``models`` on the ``kvtrim`` subcommands."""
    p = sub.add_parser(
        "models",
        help="list the models kvtrim ships and those LM Studio, Ollama and Hugging Face "
        "downloaded here",
        description="The models kvtrim ships (--model NAME), then the GGUF files in LM "
        "Studio's models folder, Ollama's model store and the Hugging Face cache; any path "
        "shown works as --model PATH.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list")


def main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Prints the models found: a table, or a JSON list with ``--json``."""
    roots = default_roots()
    models = find_models(roots)
    if args.json:
        rows = [*_embedded_rows()]
        rows += [
            {"source": m.source, "name": m.name, "size_bytes": m.size_bytes, "path": str(m.path)}
            for m in models
        ]
        out.write(json.dumps(rows) + "\n")
        return 0
    for row in _embedded_rows():
        state = "installed" if row["installed"] else f"not installed: {row['install']}"
        default = ", the default" if row["name"] == DEFAULT else ""
        out.write(f"kvtrim  {row['name']:<13}  {row['title']}: {row['about']}{default} ({state})\n")
    if not models:
        err.write("no downloaded GGUF models found; looked in:\n")
        for source, path in roots.all():
            err.write(f"  {source}: {shown(path)}\n")
        return 0
    names = [shown(m.name) for m in models]  # names and paths come from disk: no escapes
    source_w = max(len(m.source) for m in models)
    name_w = max(len(n) for n in names)
    for m, name in zip(models, names, strict=True):
        out.write(
            f"{m.source:<{source_w}}  {name:<{name_w}}  {format_size(m.size_bytes):>8}  "
            f"{shown(m.path)}\n"
        )
    return 0


def _embedded_rows() -> list[dict[str, Any]]:
    """The models kvtrim ships, whether each is installed (nothing is assembled)."""
    return [
        {
            "source": "kvtrim",
            "name": m.name,
            "path": None,  # --model NAME finds it (the default is assembled on first use)
            "title": m.title,
            "about": m.about,
            "installed": m.installed(),
            "install": m.install,
        }
        for m in EMBEDDED.values()
    ]
