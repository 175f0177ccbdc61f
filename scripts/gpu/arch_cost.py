"""What each CUDA architecture adds to scripts/gpu/build_wheel.sh: build time and
bytes, estimated from a sample of llama.cpp's CUDA files compiled once per
architecture, scaled by the whole build measured for one architecture.

    python scripts/gpu/arch_cost.py [--archs 86,89,90,120] [--sample 5]

Reads build/gpu/build.log (the compile commands; build_wheel.sh writes it) and
build/gpu/ninja_log (ninja's per-file times, copied while the build ran), compiles
the sample from the sdist build_wheel.sh fetched (two architectures at a time, one
nvcc each), and prints a Markdown table. The whole CUDA part for an architecture is
its sample's seconds times (all CUDA files' time / the sample's time) in the ninja
log, so a build slowed by other work still scales right. Sizes: bytes of object code.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORK = Path("build/gpu")
_ARCH = re.compile(r"--generate-code=arch=compute_(\d+),code=\[compute_\d+,sm_\d+\]")


def cuda_times(ninja_log: Path) -> dict[str, float]:
    """Seconds per CUDA object in the measured build (ninja log v5: start, end ms)."""
    out = {}
    for line in ninja_log.read_text().splitlines()[1:]:
        start, end, _, target, _ = line.split("\t")
        if target.endswith(".cu.o"):
            out[target] = (int(end) - int(start)) / 1000
    return out


def commands(build_log: Path) -> dict[str, str]:
    """The nvcc command line of each CUDA object."""
    out = {}
    for line in build_log.read_text().splitlines():
        m = re.search(r"\] (\S*nvcc .* -o (\S+\.cu\.o))$", line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def sample(times: dict[str, float], n: int) -> list[str]:
    """``n`` objects spread over the range of compile times, the slowest included."""
    ranked = sorted(times, key=times.__getitem__)
    return [ranked[round(i * (len(ranked) - 1) / max(n - 1, 1))] for i in range(n)]


def compile_for(cmd: str, arch: str, src_root: Path, out_dir: Path) -> tuple[float, int]:
    old_root = re.search(r"-c (\S+)/vendor/llama\.cpp/", cmd)
    assert old_root is not None, cmd
    cmd = cmd.replace(old_root.group(1), str(src_root))
    cmd = _ARCH.sub(f"--generate-code=arch=compute_{arch},code=[compute_{arch},sm_{arch}]", cmd)
    obj = out_dir / f"sm{arch}.o"
    cmd = re.sub(r" -o \S+$", f" -o {obj}", cmd)
    cmd = re.sub(r" -MD -MT \S+ -MF \S+", "", cmd)
    start = time.perf_counter()
    subprocess.run(cmd, shell=True, check=True, capture_output=True)
    return time.perf_counter() - start, obj.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--archs", default="86,89,90,120")
    p.add_argument("--sample", type=int, default=5)
    p.add_argument("--lib-bytes", type=int, help="libggml-cuda.so of the measured build")
    a = p.parse_args(argv)
    times, cmds = cuda_times(WORK / "ninja_log"), commands(WORK / "build.log")
    if not cmds or not times:
        p.error("no CUDA compile commands or times in build/gpu: run build_wheel.sh first")
    if len(times) < len(cmds):
        print(f"warning: {len(times)} of {len(cmds)} CUDA files timed", file=sys.stderr)
    measured = _ARCH.search(next(iter(cmds.values())))
    assert measured is not None
    base = measured.group(1)
    picked = sample({t: s for t, s in times.items() if t in cmds}, a.sample)
    sdist = next(WORK.glob("llama_cpp_python-*.tar.gz"))
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*"))

        def one(arch: str) -> tuple[float, int]:
            out = Path(tmp) / f"sm{arch}"
            out.mkdir()
            secs = size = 0.0
            for target in picked:
                s, b = compile_for(cmds[target], arch, src, out)
                secs, size = secs + s, size + b
            print(f"sm_{arch}: sample {secs:.0f} s, {size / 2**20:.1f} MiB", file=sys.stderr)
            return secs, int(size)

        archs = a.archs.split(",")
        with ThreadPoolExecutor(2) as pool:
            cost = dict(zip(archs, pool.map(one, archs), strict=True))
    scale = sum(times.values()) / sum(times[t] for t in picked)
    ref_b = cost[base][1] if base in cost else 0
    print(f"Measured build: sm_{base}, {len(times)} CUDA files; the sample's share of their")
    print(f"time in the ninja log: 1/{scale:.1f}.")
    print(f"Sample: {', '.join(Path(t).name.removesuffix('.cu.o') for t in picked)}.\n")
    print("| architecture | sample CPU s | sample object MiB | est. CUDA CPU-minutes | est. MiB |")
    print("|---|---|---|---|---|")
    for arch, (secs, size) in cost.items():
        est_mib = f"{a.lib_bytes * size / ref_b / 2**20:.0f}" if a.lib_bytes and ref_b else ""
        est_min = secs * scale / 60
        print(f"| sm_{arch} | {secs:.0f} | {size / 2**20:.1f} | {est_min:.0f} | {est_mib} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
