"""The HuggingFace hub as quantkit reaches it: offline mode, one quick reachability probe, the local cache.

huggingface_hub retries a hub it cannot reach five times (about 25 s) before it gives up, and transformers then
reports only the hub. quantkit asks the hub once with a short timeout, so a name that is neither a local folder nor
reachable on the hub fails at once with both facts.
"""

from __future__ import annotations

import os
from pathlib import Path

PROBE_TIMEOUT_S = 5.0
# names ending so are files, never hub repositories (a hub id may hold dots, as Qwen/Qwen2.5-0.5B does)
FILE_SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".safetensors", ".bin",
                 ".pt", ".pth", ".gguf", ".onnx", ".h5", ".yaml", ".yml", ".gz", ".zip", ".tar")
_TRUE = ("1", "ON", "YES", "TRUE")
_probed: dict[str, str | None] = {}


def hub_endpoint() -> str:
    """The hub's base URL (HF_ENDPOINT, default https://huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_offline(datasets: bool = False) -> bool:
    """True when the hub is switched off: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE (and HF_DATASETS_OFFLINE when
    ``datasets``), read now and as huggingface_hub read it at import."""
    from huggingface_hub import constants

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") + (("HF_DATASETS_OFFLINE",) if datasets else ())
    return constants.HF_HUB_OFFLINE or any(os.environ.get(n, "").upper() in _TRUE for n in names)


def _probe(endpoint: str) -> str | None:
    """One HEAD request to ``endpoint`` through huggingface_hub's session (its proxies and headers), no retries:
    None when any HTTP answer comes back, else the connection error's first line."""
    from huggingface_hub.utils import get_session

    try:  # a HEAD follows no redirect by default in both the requests and the httpx sessions
        get_session().head(endpoint, timeout=PROBE_TIMEOUT_S)
    except (TypeError, AttributeError):  # a call this huggingface_hub's session does not take: a bug, not the network
        raise
    except Exception as e:  # noqa: BLE001 - any transport failure (DNS, refused, timeout, proxy) means unreachable
        text = str(e).strip()
        return (text.splitlines()[0] if text else type(e).__name__)[:160]
    return None


def hub_unreachable_reason() -> str | None:
    """Why the hub cannot be reached (probed once per process and endpoint), or None when it answers."""
    endpoint = hub_endpoint()
    if endpoint not in _probed:
        _probed[endpoint] = _probe(endpoint)
    return _probed[endpoint]


def looks_like_path(name: str) -> bool:
    """True when ``name`` can only mean a local path: it starts with ./ ../ / ~ or a drive, holds more than the one
    slash of org/name (or a backslash on Windows), or ends with a file suffix."""
    if name.startswith((".", "/", "~")) or os.path.isabs(name) or name.count("/") > 1:
        return True
    if os.sep != "/" and os.sep in name:
        return True
    return Path(name).suffix.lower() in FILE_SUFFIXES


def is_repo_id(name: str) -> bool:
    """True when ``name`` is a well-formed hub repository id (``name`` or ``org/name``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def cached_model_folder(repo_id: str) -> Path | None:
    """The local HF cache's snapshot folder of ``repo_id`` (its main revision) when it holds a config.json, else
    None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id the cache cannot hold is simply not cached
        return None
    return Path(hit).parent if isinstance(hit, str) else None
