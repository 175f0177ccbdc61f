"""Hostile inputs found by an attacker, each refused in one line or read in
bounded time and memory: devices and pipes, zip and PDF bombs, quadratic
whitespace, BOM-less UTF-16, colliding batch outputs, a full disk, and options
that used to fail after the whole prefill."""

from __future__ import annotations

import errno
import io
import os
import socket
import struct
import threading
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from helpers.docs_for_tests import prose

from engine import ConfigError, DocumentError, ModelError, Sampling
from engine.cli import main as cli
from engine.cli import options as cli_options
from engine.cli.main import main
from engine.documents import limits
from engine.documents.formats import html_text, squeeze_whitespace
from engine.documents.load import load_document
from engine.runtime.batch import expand
from engine.session.trace import TokenTrace


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _one_error_line(err: str) -> str:
    assert err.startswith("kvtrim: error:") and err.count("\n") == 1, err
    return err


# 1. devices, pipes and sockets; the size limits


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused_before_it_is_read(device):
    start = time.perf_counter()
    with pytest.raises(DocumentError, match="not a regular file"):
        load_document(device)
    code, _out, err = _run("ask", device, "-q", "What?")
    assert code == 2 and "not a regular file" in _one_error_line(err)
    assert time.perf_counter() - start < 5


def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            load_document(fifo)
        except BaseException as exc:
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # it blocked in open(): let it go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("opening the pipe blocked")
    assert isinstance(raised[0], DocumentError) and "named pipe" in str(raised[0])


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.txt"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(DocumentError, match="not a regular file"):
            load_document(path)


def test_a_file_over_the_size_limit_is_refused_with_the_limit(tmp_path, monkeypatch):
    assert limits.MAX_DOCUMENT_BYTES == 128 * 2**20
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 1000)
    path = tmp_path / "big.txt"
    path.write_text("word " * 300)
    with pytest.raises(DocumentError, match=r"limit of 1,000 bytes") as info:
        load_document(path)
    assert "\n" not in str(info.value)
    path.write_text("word " * 200)  # exactly at the limit
    assert load_document(path).startswith("word")


@pytest.mark.parametrize("kind", ["txt", "html", "docx", "pdf"])
def test_text_over_the_character_limit_is_refused(tmp_path, monkeypatch, kind):
    import docx
    from helpers.docs_for_tests import text_pdf

    monkeypatch.setattr(limits, "MAX_TEXT_CHARACTERS", 500)
    line = "The pass key is 4242 and the kettle is blue. "
    path = tmp_path / f"long.{kind}"
    if kind == "docx":
        d = docx.Document()
        for _ in range(20):
            d.add_paragraph(line)
        d.save(path)
    elif kind == "pdf":
        path.write_bytes(text_pdf([line] * 20))
    else:
        path.write_text(f"<p>{line * 20}</p>" if kind == "html" else line * 20)
    with pytest.raises(DocumentError, match="limit of 500 characters"):
        load_document(path)


def test_a_docx_with_an_entity_declaration_is_refused_not_cut_short(tmp_path):
    """Issue 23 WEAK: a DOCTYPE declaring an external entity; the text after the
    entity was silently lost ("end. The pass key is 4242." never read)."""
    import docx

    path = tmp_path / "xxe.docx"
    d = docx.Document()
    d.add_paragraph("Start &xxe; end. The pass key is 4242.")
    d.save(path)
    with zipfile.ZipFile(path) as z:
        parts = {i.filename: z.read(i) for i in z.infolist()}
    xml = parts["word/document.xml"].decode()
    declared = '<!DOCTYPE w [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    parts["word/document.xml"] = xml.replace("?>", "?>" + declared, 1).replace(
        "&amp;xxe;", "&xxe;"
    ).encode()
    with zipfile.ZipFile(path, "w") as z:
        for filename, data in parts.items():
            z.writestr(filename, data)
    with pytest.raises(DocumentError, match="declares XML entities"):
        load_document(path)


# 2. zip bombs (.docx) and PDF bombs


def _bomb_docx(path: Path, zeros_mib: int) -> None:
    """A .docx-shaped zip whose word/document.xml is ``zeros_mib`` MiB of zeros."""
    chunk = bytes(2**20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        with z.open("word/document.xml", "w") as part:
            for _ in range(zeros_mib):
                part.write(chunk)


def test_a_zip_bomb_docx_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "bomb.docx"
    _bomb_docx(path, 300)  # 300 MiB of zeros, about 1.3 MB on disk
    assert path.stat().st_size < 2 * 2**20
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(DocumentError, match=r"unpacks to more than kvtrim's limit of 256 MiB"):
            load_document(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 5 and peak < 32 * 2**20, peak


def _lie_about_sizes(data: bytes, size: int) -> bytes:
    """The zip with every entry's uncompressed size (local header and central
    directory) rewritten to ``size``: headers that lie."""
    out = bytearray(data)
    for sig, at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        i = out.find(sig)
        while i >= 0:
            out[i + at : i + at + 4] = struct.pack("<I", size)
            i = out.find(sig, i + 4)
    return bytes(out)


def test_a_zip_with_lying_headers_is_read_with_a_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_UNPACKED_BYTES", 2 * 2**20)
    honest = tmp_path / "honest.docx"
    _bomb_docx(honest, 16)
    liar = tmp_path / "liar.docx"
    liar.write_bytes(_lie_about_sizes(honest.read_bytes(), 100))
    with pytest.raises(DocumentError, match="unpacks to more than kvtrim's limit of 2 MiB"):
        load_document(honest)
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError) as info:
            load_document(liar)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(info.value) and peak < 8 * 2**20, (str(info.value), peak)


def _pdf_with_page_content(content: bytes) -> bytes:
    """A one-page PDF whose content stream (Flate-compressed) is ``content``."""
    packed = zlib.compress(content, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    trailer = b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
    return out + trailer % (len(objects) + 1, xref)


def test_a_pdf_page_that_inflates_past_the_limit_is_refused_quickly(tmp_path):
    """6 MB of text operators in one page: pypdf would take a minute (half an hour
    at 60 MB, which its own 75 MB stream limit lets through)."""
    line = b"(" + b"a" * 1000 + b") ' "
    path = tmp_path / "bomb.pdf"
    path.write_bytes(_pdf_with_page_content(b"BT /F1 12 Tf 72 720 Td 14 TL " + line * 6_000))
    assert path.stat().st_size < 50_000
    start = time.perf_counter()
    limit = r"page 1's content is 6 MiB, over kvtrim's limit of 4 MiB"
    with pytest.raises(DocumentError, match=limit):
        load_document(path)
    assert time.perf_counter() - start < 5
    small = tmp_path / "small.pdf"
    small.write_bytes(_pdf_with_page_content(b"BT /F1 12 Tf 72 720 Td 14 TL " + line * 3))
    assert load_document(small).count("a" * 1000) == 3


# 3. whitespace cleanup is linear

RUNS = {
    "300,000 NBSP": "\u00a0" * 300_000,
    "NBSP, space and tab": "\u00a0 \t" * 100_000,
    "NBSP then one break": "\u00a0" * 300_000 + "\n",
    "break and NBSP alternating": "\n\u00a0" * 150_000,
    "300,000 em spaces": "\u2003" * 300_000,
    "CR LF runs": "\r\n \t\u00a0" * 60_000,
    "spaces between words": "w \u00a0 " * 75_000,
}


@pytest.mark.parametrize("name", list(RUNS))
def test_whitespace_runs_clean_in_linear_time(name):
    html = f"<p>a{RUNS[name]}b</p>"
    start = time.perf_counter()
    text = html_text(html)
    assert time.perf_counter() - start < 1.0, name
    assert text.startswith("a") and text.endswith("b") and len(text) <= len(RUNS[name])


def test_whitespace_is_squeezed_to_spaces_breaks_and_blank_lines():
    assert squeeze_whitespace(" a\u00a0\u00a0 b \t c ") == "a b c"
    assert squeeze_whitespace("a \n\u00a0 b") == "a\nb"
    assert squeeze_whitespace("a \n \n\n\u00a0b\r\nc") == "a\n\nb\nc"
    assert html_text("<p>one</p>\n\n<p>two&nbsp;&nbsp;three</p>") == "one\n\ntwo three"


# 4. UTF-16 without a byte-order mark

UTF16_TEXTS = {
    "english": "The pass key is 4242. Remember it.\nThe kettle is blue.\n" * 20,
    "russian": "Ключ доступа 4242. Запомните его.\nЧайник синий.\n" * 20,  # noqa: RUF001
    "greek": "Το κλειδί είναι 4242. Θυμηθείτε το.\n" * 20,  # noqa: RUF001
    "chinese": "密钥是四二四二。请记住它。水壶是蓝色的。\n" * 40,
    "chinese without breaks": "密钥是四二四二。请记住它。水壶是蓝色的。" * 40,
}


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name", list(UTF16_TEXTS))
def test_utf16_without_bom_is_read(tmp_path, encoding, name):
    path = tmp_path / f"{name}.txt"
    path.write_bytes(UTF16_TEXTS[name].encode(encoding))
    assert load_document(path) == UTF16_TEXTS[name]


def test_utf16_like_binary_is_still_binary(tmp_path):
    counts = b"".join(struct.pack("<H", i % 50) for i in range(4000))  # small 16-bit numbers
    path = tmp_path / "counts.txt"
    path.write_bytes(counts)
    with pytest.raises(DocumentError, match="binary"):
        load_document(path)


# 5. memory while a long text is read


def test_a_long_text_is_read_without_copies(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text(prose(400, seed=5) * 20)  # about 4 MB
    size = path.stat().st_size
    tracemalloc.start()
    try:
        text = load_document(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(text) == size and peak < 2.2 * size, (peak, size)


def test_token_pieces_are_asked_once_per_distinct_token():
    asked: list[int] = []

    def piece(token: int) -> bytes:
        asked.append(token)
        return b"ab"[token % 2 : token % 2 + 1] * (1 + token % 3)

    trace = TokenTrace(piece)
    tokens = [i % 50 for i in range(20_000)]
    text = b"".join(piece(t) for t in tokens).decode()
    asked.clear()
    trace.add("document", text, tokens)
    assert sorted(asked) == list(range(50))
    seg = trace.segments[0]
    assert seg.n_tokens == 20_000 and seg.char_ends[-1] == len(text)


# 6. batch outputs: unique names, atomic writes, a full disk


def test_batch_names_keep_the_path_under_the_folder_and_never_collide(tmp_path):
    docs = tmp_path / "docs"
    for sub in ("a", "b"):
        (docs / sub).mkdir(parents=True)
        (docs / sub / "notes.txt").write_text(f"notes {sub}")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("x")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "NOTES.txt").write_text("y")
    given = [
        docs,
        tmp_path / "x" / "notes.txt",
        tmp_path / "y" / "NOTES.txt",
        docs / "a" / "notes.txt",  # met twice: summarized once
    ]
    sources = expand(given)
    names = [s.out_name.as_posix() for s in sources]
    assert names == ["a/notes.txt.md", "b/notes.txt.md", "notes.txt.md", "NOTES-2.txt.md"]
    assert len({n.casefold() for n in names}) == len(names), "unique, even without case"


@pytest.mark.parametrize("out", ["file", "/dev/null"])
def test_out_that_is_not_a_folder_is_one_line_before_the_model_loads(tmp_path, out):
    doc = tmp_path / "a.txt"
    doc.write_text(prose(5))
    target = tmp_path / "taken.md" if out == "file" else Path(out)
    if out == "file":
        target.write_text("keep me")
    start = time.perf_counter()
    code, _out, err = _run("summarize", str(doc), "--out", str(target))
    assert code == 2 and "exists and is not a folder" in _one_error_line(err)
    assert time.perf_counter() - start < 5  # no model was loaded
    if out == "file":
        assert target.read_text() == "keep me"


def _two_notes(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    for sub, seed in (("a", 1), ("b", 2)):
        (docs / sub).mkdir(parents=True)
        (docs / sub / "notes.txt").write_text(prose(3, seed=seed))
    return docs


@pytest.mark.slow
def test_same_named_files_in_subfolders_get_their_own_summaries(tmp_path):
    docs, out_dir = _two_notes(tmp_path), tmp_path / "out"
    code, table, err = _run("summarize", str(docs), "--out", str(out_dir), "--max-tokens", "4")
    assert code == 0, err
    for sub in ("a", "b"):
        summary = (out_dir / sub / "notes.txt.md").read_text()
        assert summary.startswith("# notes.txt\n") and "kvtrim snapkv" in summary
    assert "| a/notes.txt |" in table and "| b/notes.txt |" in table
    assert not [p for p in out_dir.rglob(".*")], "no temporary files left"


@pytest.mark.slow
def test_a_full_disk_keeps_finished_summaries_and_is_one_line(tmp_path, monkeypatch):
    docs, out_dir = _two_notes(tmp_path), tmp_path / "out"
    real_fsync = os.fsync
    calls = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:  # the second summary
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, _out, err = _run("summarize", str(docs), "--out", str(out_dir), "--max-tokens", "4")
    line = _one_error_line(err)
    assert code == 2 and "No space left on device" in line and "1 finished summary" in line
    assert (out_dir / "a" / "notes.txt.md").read_text().startswith("# notes.txt\n")
    assert not (out_dir / "b" / "notes.txt.md").exists()
    assert not [p for p in out_dir.rglob(".*")], "the half-written temporary file is gone"


# 7. every option is checked before a document is read or a model loaded

BAD_OPTIONS = [
    (["--chunk", "0"], "--chunk: must be at least 16"),
    (["--max-tokens", "0"], "--max-tokens: must be at least 1"),
    (["--max-tokens", "-1"], "--max-tokens: must be at least 1"),
    (["--threads", "999"], "logical CPUs"),
    (["--threads", "0"], "--threads: must be at least 1"),
    (["--temperature", "inf"], "finite"),
    (["--temperature", "nan"], "finite"),
    (["--temperature", "-0.5"], "--temperature: must be >= 0"),
    (["--top-p", "0"], "--top-p: must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p: must be in (0, 1]"),
    (["--top-p", "nan"], "finite"),
    (["--top-k", "-1"], "--top-k: must be at least 0"),
    (["--min-p", "2"], "--min-p: must be in [0, 1]"),
    (["--budget", "0"], "--budget: must be at least 16"),
    (["--budget", "-5"], "--budget: must be at least 16"),
    (["--budget", "20"], "too small for snapkv"),
    (["--seed", "-1"], "--seed: must be at least 0"),
    (["--gpu-layers", "-1"], "--gpu-layers: must be at least 0"),
    (["--repack", "maybe"], "--repack: invalid choice"),
    (["--budget", "many"], "not a whole number"),
]


@pytest.mark.parametrize("command", ["ask", "summarize"])
@pytest.mark.parametrize("argv, message", BAD_OPTIONS)
def test_bad_options_are_one_line_before_anything_is_read(tmp_path, command, argv, message):
    missing = str(tmp_path / "not-there.txt")  # reading it would say "not found"
    question = ["-q", "Who?"] if command == "ask" else []
    code, _out, err = _run(command, missing, *question, *argv)
    assert code == 2 and message in _one_error_line(err) and "not found" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu-layers", "-1"], "--gpu-layers: must be at least 0"),
        (["--repack", "sometimes"], "--repack: invalid choice"),
    ],
)
def test_info_options_are_checked_too(argv, message):
    code, _out, err = _run("info", *argv)
    assert code == 2 and message in _one_error_line(err)


def test_kvtrim_repack_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("KVTRIM_REPACK", "sideways")
    code, _out, err = _run("info")
    assert code == 2 and "KVTRIM_REPACK must be one of auto, on, off" in _one_error_line(err)
    monkeypatch.setenv("KVTRIM_REPACK", "off")
    assert cli.parse_args(["info"]).repack == "off"
    assert cli.parse_args(["info", "--repack", "on"]).repack == "on"


def test_good_edge_values_pass():
    from engine.session.config import usable_cpus

    sampling = ["--top-p", "1", "--temperature", "0", "--seed", "0"]
    sizes = ["--threads", str(usable_cpus()), "--budget", "1024", "--chunk", "16"]
    args = cli.parse_args(["ask", "x.txt", "-q", "?", *sampling, *sizes])
    assert (args.top_p, args.temperature, args.seed, args.chunk_tokens) == (1.0, 0.0, 0, 16)
    assert args.repack in ("auto", "on", "off")


@pytest.mark.parametrize("command", ["ask", "summarize", "batch", "info"])
def test_repack_reaches_every_engine_the_cli_makes(tmp_path, monkeypatch, command):
    made: list[dict] = []

    def engine(*_args: object, **kwargs: object) -> None:
        made.append(kwargs)
        raise ModelError("stop here")

    monkeypatch.setattr(cli_options, "Engine", engine)
    doc = tmp_path / "a.txt"
    doc.write_text(prose(3))
    argv = {
        "ask": ["ask", str(doc), "-q", "Who?"],
        "summarize": ["summarize", str(doc)],
        "batch": ["summarize", str(doc), "--out", str(tmp_path / "out")],
        "info": ["info"],
    }[command]
    code, _out, err = _run(*argv, "--repack", "off")
    assert code == 2 and "stop here" in err
    assert made == [made[0]] and made[0]["repack"] == "off"


def test_sampling_refuses_what_the_options_refuse():
    for bad in (
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(top_p=float("nan")),
        dict(seed=-1),
        dict(top_k=-1),
        dict(min_p=float("nan")),
    ):
        with pytest.raises(ConfigError):
            Sampling(**bad)


def test_a_temperature_too_small_to_divide_by_is_greedy():
    """1e-320 overflowed logits / T to inf, and the sampler returned from NaNs."""
    import numpy as np

    from engine.session.sampling import Sampler, Sampling

    logits = np.array([0.5, 3.0, -1.0, 2.9], dtype=np.float32)
    assert Sampler(Sampling(1e-320, seed=1))(logits) == 1
