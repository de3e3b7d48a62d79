"""CUDA C++ kernels compiled at run time through CuPy/NVRTC: the decode GEMVs and the LiquidQuant cluster kernel.
The sources are the .cu/.cuh files of this folder."""
