"""PyInstaller hook for llama-cpp-python: its ctypes libraries (libllama, libggml*,
libmtmd) live in llama_cpp/lib and are loaded by path, so PyInstaller cannot see
them; collect them where llama_cpp looks (``llama_cpp/lib``)."""

from PyInstaller.utils.hooks import collect_dynamic_libs

binaries = collect_dynamic_libs("llama_cpp")
hiddenimports = ["llama_cpp._internals", "llama_cpp._ctypes_extensions"]
