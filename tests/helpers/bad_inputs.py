"""A corpus of bad inputs, made on the spot: documents users drop and model files
they pick. Each case is a path and what should happen: ``None`` when the file is
usable text, otherwise a fragment of the one-line error message."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from engine.native.embedded import default_model_path
from helpers.docs_for_tests import text_pdf


def pdfs() -> dict[str, bytes]:
    """Broken PDFs: image-only, encrypted, corrupt, truncated."""
    from pypdf import PdfReader, PdfWriter

    blank = PdfWriter()
    blank.add_blank_page(200, 200)
    scan = io.BytesIO()
    blank.write(scan)
    secret = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["secret text"]))))
    secret.encrypt("hunter2")
    locked = io.BytesIO()
    secret.write(locked)
    good = text_pdf(["The pass key is 4242."] * 20)
    return {
        "image-only.pdf": scan.getvalue(),
        "encrypted.pdf": locked.getvalue(),
        "corrupt.pdf": b"%PDF-1.4\n1 0 obj <</Type /Catalog",
        "truncated.pdf": good[: len(good) // 2],
    }


def documents(tmp: Path) -> dict[str, tuple[Path, str | None]]:
    """name -> (path, expected message fragment or None for readable text)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cases: dict[str, tuple[Path, str | None]] = {}

    def put(name: str, data: bytes, expect: str | None) -> None:
        path = tmp / name
        path.write_bytes(data)
        cases[name] = (path, expect)

    put("zero-byte.txt", b"", "empty")
    put("blank.md", b" \n\t\n", "empty")
    put("binary.txt", bytes(range(256)) * 64, "binary")
    put("huge-line.txt", b"word " * 400_000, None)  # 2 MB on one line
    put("cp1252.txt", "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve.".encode("cp1252"), None)
    put(
        "mixed.txt",
        "d\u00e9j\u00e0 vu ".encode() * 50 + "fa\u00e7ade ".encode("latin-1") * 50,
        None,
    )
    for name, data in pdfs().items():
        expect = {
            "image-only.pdf": "no text layer",
            "encrypted.pdf": "encrypted",
        }.get(name, "not a readable PDF")
        put(name, data, expect)
    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("hello.txt", "a zip of something else")
    put("other-zip.docx", other.getvalue(), "not a readable .docx")
    put("image.png", b"\x89PNG\r\n\x1a\n" + bytes(100), "not supported")
    (tmp / "a-folder").mkdir(exist_ok=True)
    cases["a-folder"] = (tmp / "a-folder", "directory")
    cases["missing.txt"] = (tmp / "missing.txt", "not found")
    loop = tmp / "loop.txt"
    if not loop.is_symlink():
        os.symlink(loop, loop)  # a link to itself
    cases["symlink-loop.txt"] = (loop, "cannot read")
    return cases


def models(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, expected message fragment) for model files that cannot load."""
    tmp.mkdir(parents=True, exist_ok=True)
    real = default_model_path().read_bytes()[:4_000_000]
    cases = {
        "zero-byte.gguf": (b"", "empty"),
        "truncated.gguf": (real, "truncated"),
        "header-only.gguf": (real[:100], "truncated"),
        "text-renamed.gguf": (b"this is a text file, not a model\n" * 10, "not a GGUF"),
    }
    out: dict[str, tuple[Path, str]] = {}
    for name, (data, expect) in cases.items():
        (tmp / name).write_bytes(data)
        out[name] = (tmp / name, expect)
    (tmp / "folder.gguf").mkdir(exist_ok=True)
    out["folder.gguf"] = (tmp / "folder.gguf", "not a file")
    out["missing.gguf"] = (tmp / "missing.gguf", "not found")
    return out


SAMPLING_REFUSED = [  # (raw JSON of one field, the field a 400 names)
    ('"seed": -1', "seed"),
    ('"temperature": NaN', "temperature"),
    ('"temperature": Infinity', "temperature"),
    ('"temperature": -1', "temperature"),
    ('"top_p": 0', "top_p"),
    ('"top_p": 1.5', "top_p"),
    ('"top_k": 2.5', "top_k"),
    ('"top_k": true', "top_k"),
    ('"top_k": "3"', "top_k"),
    ('"top_k": 2147483648', "top_k"),
    ('"min_p": 1.5', "min_p"),
    ('"min_p": NaN', "min_p"),
    ('"min_p": "0.5"', "min_p"),
    ('"ignore_eos": 1', "ignore_eos"),
    ('"ignore_eos": "true"', "ignore_eos"),
]
"""Sampling fields a request may not carry: NaN is not JSON, so each is raw text."""
