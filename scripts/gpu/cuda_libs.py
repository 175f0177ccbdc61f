"""Prints the folders of CUDA's runtime libraries (libcudart, libcublas) that this
Python's pip packages hold (nvidia-cuda-runtime, nvidia-cublas), ':'-joined for
LD_LIBRARY_PATH: the CUDA build's RUNPATH names the toolkit it was built against."""

import glob
import os
import site

roots = [*site.getsitepackages(), site.getusersitepackages()]
pattern = "nvidia/**/libcu*.so*"
dirs = {os.path.dirname(p) for r in roots for p in glob.glob(f"{r}/{pattern}", recursive=True)}
print(":".join(sorted(dirs)))
