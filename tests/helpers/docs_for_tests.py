"""Test documents: llama.cpp's passkey haystack and varied prose."""

from __future__ import annotations

import random

from engine.bench.tasks import FILLER as JUNK
from engine.bench.tasks import PASSKEY_PREFIX, PASSKEY_SUFFIX
from engine.bench.tasks import passkey_haystack as passkey_document

__all__ = [
    "JUNK",
    "PASSKEY_PREFIX",
    "PASSKEY_SUFFIX",
    "passkey_document",
    "passkey_key",
    "prose",
    "text_pdf",
]


def passkey_key(depth: float) -> int:
    return random.Random(round(depth * 1000)).randint(10000, 99999)


def prose(n_sentences: int, seed: int = 0) -> str:
    """Varied plain English, so attention is not uniform (no repeated filler)."""
    rng = random.Random(seed)
    names = ["Alice", "Bob", "Clara", "Dmitri", "Esther", "Farid", "Greta", "Hiro"]
    verbs = ["repaired", "painted", "sold", "borrowed", "found", "measured", "cleaned"]
    things = [
        "the bicycle",
        "a red kettle",
        "the garden fence",
        "an old violin",
        "the library map",
        "a copper lamp",
        "the kitchen clock",
    ]
    places = [
        "in Lisbon",
        "near the harbour",
        "at the market",
        "behind the school",
        "in the attic",
        "on Tuesday",
        "before dawn",
    ]
    return " ".join(
        f"{rng.choice(names)} {rng.choice(verbs)} {rng.choice(things)} {rng.choice(places)}."
        for _ in range(n_sentences)
    )


def text_pdf(lines: list[str]) -> bytes:
    """A minimal one-page PDF with a Helvetica text layer, written by hand."""
    content = (
        "BT /F1 12 Tf 72 720 Td 14 TL "
        + " ".join(
            "(" + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ") '"
            for line in lines
        )
        + " ET"
    )
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        "/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    ).encode()
    return out
