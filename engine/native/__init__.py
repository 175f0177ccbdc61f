"""The native layer: llama.cpp through llama-cpp-python and our own ctypes (context,
tensor reads, the eval-callback capture), the model and its memory layout, the CPU and
GPU facts, memory monitors and the crash log. Imports nothing of kvtrim but errors."""
