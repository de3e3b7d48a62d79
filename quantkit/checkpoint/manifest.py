"""``quantkit.json``, the manifest of a packed checkpoint (docs/checkpoint-format.md).

It says what was quantized how (recipe, plan hash, source model), which layout each linear's partitions use
(with the metadata the layout's ``unpack`` needs and the names of its tensors), and for every tensor its shape,
dtype, sha256 and shard. Readers check ``format_version`` first: a newer manifest is refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.checkpoint.atomic import MANIFEST_NAME
from quantkit.errors import QuantkitError

FORMAT = "quantkit.checkpoint"
FORMAT_VERSION = 3  # the newest version written; each is written only where a checkpoint needs it, else 1
ROTATION_VERSION = 2  # a linear may carry an online input rotation
LINEAR_ACTIVATION_VERSION = 3  # a linear may carry its own activation entry (a quantized, weight-only lm_head)
DENSE = "dense"  # layout name of tensors stored as they are (embeddings, norms, biases, skipped linears)

_REQUIRED = {"format": str, "format_version": int, "quantkit_version": str, "recipe": dict, "source": dict,
             "export": str, "target": str, "linears": dict, "tensors": dict, "aliases": dict}
_TENSOR_KEYS = ("shard", "dtype", "shape", "sha256", "layout")
_PART_KEYS = ("bits", "layout", "meta", "tensors", "rows")


def linear_activation(entry: dict, manifest: dict) -> dict | None:
    """The activation entry a linear runs with: its own where it has one (``"activation": null``: a weight-only
    linear such as a quantized lm_head), else the manifest's (None: weights only)."""
    return entry["activation"] if "activation" in entry else manifest.get("activation")


def is_checkpoint(path: str | Path) -> bool:
    """True when ``path`` is a directory holding a quantkit manifest (a packed checkpoint); never for a built-in
    model name such as ``builtin:reference``, which always means the embedded model."""
    if str(path).startswith("builtin:"):
        return False
    p = Path(path).expanduser()
    return p.is_dir() and (p / MANIFEST_NAME).is_file()


def _bad(path: Path, what: str) -> QuantkitError:
    return QuantkitError(f"manifest '{path}' is invalid: {what}; re-run `quantkit pack`")


def validate(manifest: dict, path: Path) -> dict:
    """Check the manifest's version and structure (required fields, every linear's tensors listed in
    ``tensors``); returns it unchanged or raises QuantkitError naming the first problem."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise QuantkitError(f"'{path}' is not a quantkit checkpoint manifest (format "
                            f"{manifest.get('format') if isinstance(manifest, dict) else None!r}); point at a folder "
                            "written by `quantkit pack`, or re-run it")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise _bad(path, f"format_version is {version!r}")
    if version > FORMAT_VERSION:
        raise QuantkitError(f"checkpoint '{path.parent}' has format version {version}, this quantkit reads up to "
                            f"{FORMAT_VERSION}; upgrade quantkit")
    for key, typ in _REQUIRED.items():
        if not isinstance(manifest.get(key), typ):
            raise _bad(path, f"field '{key}' is missing or not a {typ.__name__}")
    tensors = manifest["tensors"]
    for name, entry in tensors.items():
        missing = [k for k in _TENSOR_KEYS if k not in entry]
        if missing:
            raise _bad(path, f"tensor '{name}' lacks {', '.join(missing)}")
    for name, lin in manifest["linears"].items():
        parts = lin.get("partitions")
        if not isinstance(parts, list) or not parts:
            raise _bad(path, f"linear '{name}' has no partitions")
        for p in parts:
            missing = [k for k in _PART_KEYS if k not in p]
            if missing:
                raise _bad(path, f"a partition of linear '{name}' lacks {', '.join(missing)}")
            for tname in list(p["tensors"].values()) + ([p["rows"]] if p["rows"] else []):
                if tname not in tensors:
                    raise _bad(path, f"linear '{name}' names tensor '{tname}', which the manifest does not list")
        rot = lin.get("input_rotation")
        if rot is not None and not (isinstance(rot, dict) and isinstance(rot.get("seed"), int)
                                    and rot.get("width") == lin.get("in_features")):
            raise _bad(path, f"linear '{name}' has an input_rotation without an integer seed and its in_features "
                             "as width")
    shards = manifest.get("shards")  # optional: checkpoints written before it was recorded lack it
    if shards is not None and not (isinstance(shards, dict) and all(
            isinstance(r, dict) and isinstance(r.get("bytes"), int) and isinstance(r.get("header_sha256"), str)
            for r in shards.values())):
        raise _bad(path, "field 'shards' is not a map of shard file to its bytes and header_sha256")
    for alias, target in manifest["aliases"].items():
        if target not in tensors:
            raise _bad(path, f"alias '{alias}' points to unknown tensor '{target}'")
    return manifest


def read_manifest(folder: str | Path) -> dict:
    """Read and validate ``folder/quantkit.json``; QuantkitError when the folder is no quantkit checkpoint."""
    folder = Path(folder).expanduser()
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise QuantkitError(f"checkpoint '{folder}' does not exist or is not a directory; check the path (a folder "
                            "written by `quantkit pack`)")
    if not path.is_file():
        raise QuantkitError(f"'{folder}' has no {MANIFEST_NAME}; it is not a packed quantkit checkpoint "
                            "(pack one with `quantkit pack`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"not readable JSON ({e})") from None
    return validate(manifest, path)


def shard_contents(manifest: dict) -> dict[str, dict[str, dict]]:
    """shard file → {tensor name → manifest entry}, in manifest order."""
    out: dict[str, dict[str, dict]] = {}
    for name, entry in manifest["tensors"].items():
        out.setdefault(entry["shard"], {})[name] = entry
    return out
