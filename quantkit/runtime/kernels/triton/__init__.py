"""Triton kernels: the int8 tensor-core GEMMs (W8A8, MixLLM W4A8, LiquidQuant W4A8, mixed W4.4A8), W4A16, the
activation quantizer and RMSNorm. They run on any CUDA GPU Triton supports and under TRITON_INTERPRET=1 on a CPU."""
