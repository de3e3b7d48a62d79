"""Text sources for calibration and evaluation.

A source name is one of:

* ``kjv`` (alias ``builtin``) — the public-domain King James Bible shipped in ``calibration/`` (train/test split);
* a local ``.txt`` file (paragraphs separated by blank lines) or ``.jsonl`` file (one JSON object per line with a
  ``text`` field), or a directory holding ``train.*``/``test.*`` such files;
* a ``datasets`` hub name — ``wikitext2``, ``c4``, ``pile`` — read the way GPTQ/AWQ/MixLLM read them, when the hub
  (or a local HF cache) is reachable.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.resources import shipped_dir

BUILTIN_NAMES = ("kjv", "builtin")
HUB_NAMES = ("wikitext2", "c4", "pile")
SPLITS = ("train", "test")


def known_sources() -> str:
    return "kjv (shipped), wikitext2, c4, pile, or a path to a .txt/.jsonl file"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise QuantkitError(f"unknown split '{split}'; use train or test")


def builtin_text(split: str) -> str:
    """The shipped KJV corpus split (calibration/kjv-{split}.txt, installed as quantkit.calibration)."""
    _check_split(split)
    return shipped_dir("quantkit.calibration", "calibration").joinpath(f"kjv-{split}.txt").read_text(encoding="utf-8")


def _read_local_file(path: Path) -> list[str]:
    if path.suffix == ".jsonl":
        docs = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise QuantkitError(f"{path}:{lineno} is not valid JSON; a .jsonl file needs one object "
                                        "per line with a 'text' field") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise QuantkitError(f"{path}:{lineno} has no string 'text' field; each .jsonl line needs one")
                docs.append(obj["text"])
        return docs
    if path.suffix in (".txt", ".md", ""):
        text = path.read_text(encoding="utf-8", errors="replace")
        return [p for p in text.split("\n\n") if p.strip()]
    raise QuantkitError(f"unsupported text file '{path}'; use a .txt or .jsonl file")


def local_documents(source: str, split: str) -> list[str]:
    """Documents from a local file, or from ``train.*``/``test.*`` inside a directory."""
    path = Path(source).expanduser()
    if path.is_dir():
        for ext in (".jsonl", ".txt"):
            f = path / f"{split}{ext}"
            if f.is_file():
                return _read_local_file(f)
        raise QuantkitError(f"directory '{source}' has no {split}.txt or {split}.jsonl")
    return _read_local_file(path)


def _hub_documents(name: str, split: str) -> list[str]:
    """wikitext-2-raw-v1 (train/test), c4 (GPTQ's en shards: train 00000, validation 00000), pile (AWQ's val
    backup: validation for both splits)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise QuantkitError(f"dataset '{name}' needs the 'datasets' package (pip install datasets), "
                            "or pass a local .txt/.jsonl file") from None
    try:
        if name == "wikitext2":
            ds = load_dataset("wikitext", "wikitext-2-raw-v1", split="train" if split == "train" else "test")
            return list(ds["text"])
        if name == "c4":
            files = ("en/c4-train.00000-of-01024.json.gz" if split == "train"
                     else "en/c4-validation.00000-of-00008.json.gz")
            ds = load_dataset("allenai/c4", data_files={"data": files}, split="data")
            return list(ds["text"])
        ds = load_dataset("mit-han-lab/pile-val-backup", split="validation")
        return list(ds["text"])
    except Exception as e:  # noqa: BLE001 - datasets raises many types for "offline / not cached"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise QuantkitError(f"could not load dataset '{name}' ({first}); the hub is unreachable or the data is not "
                            "cached — pass a local .txt/.jsonl file with --dataset PATH, or use --dataset kjv") from None


def check_source(source: str) -> None:
    """Refuse a source name that is neither shipped, a hub name nor an existing path (without reading anything), so
    a command can fail on it before loading a model."""
    if source in BUILTIN_NAMES or source in HUB_NAMES or Path(source).expanduser().exists():
        return
    if "/" in source or "." in source:
        raise QuantkitError(f"text file '{source}' does not exist; pass an existing .txt/.jsonl path")
    raise QuantkitError(f"unknown dataset '{source}'; use {known_sources()}")


def documents(source: str, split: str) -> list[str]:
    """The documents of a source split (see module doc for the accepted names)."""
    _check_split(split)
    check_source(source)
    if source in BUILTIN_NAMES:
        return [p for p in builtin_text(split).split("\n\n") if p.strip()]
    if source in HUB_NAMES:
        return _hub_documents(source, split)
    return local_documents(source, split)


def joined_text(source: str, split: str) -> str:
    """Documents joined with "\\n\\n", the way GPTQ/MixLLM build their evaluation text."""
    return "\n\n".join(documents(source, split))
