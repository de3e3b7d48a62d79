"""Packed checkpoints (docs/checkpoint-format.md): atomic sharded writing, the quantkit.json manifest, reloading
into a model of QuantLinear modules, verification and summaries."""

from quantkit.checkpoint.manifest import FORMAT_VERSION, is_checkpoint, read_manifest
from quantkit.checkpoint.reader import load, load_packed, verify_checkpoint
from quantkit.checkpoint.report import summarize
from quantkit.checkpoint.shards import parse_size
from quantkit.checkpoint.writer import build_checkpoint, write_checkpoint

__all__ = ["FORMAT_VERSION", "build_checkpoint", "is_checkpoint", "load", "load_packed", "parse_size",
           "read_manifest", "summarize", "verify_checkpoint", "write_checkpoint"]
