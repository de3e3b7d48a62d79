"""Text sources for calibration and evaluation.

A source name is one of:

* ``kjv`` (alias ``builtin``) — the public-domain King James Bible shipped in ``calibration/`` (train/test split);
* ``pydoc`` — the Python reference topics (English technical prose with code, PSF licence) shipped beside it: a
  generic, modern-English domain for real pretrained models, whose training text is far from the 1611 Bible;
* a local file: ``.txt``/``.md`` (paragraphs separated by blank lines), ``.jsonl`` (one JSON object per line),
  ``.json`` (JSON lines or an array of objects), ``.csv`` (with a header row) or ``.parquet``; the last four hold
  records whose text is in one column (``--text-column``, default ``text``); ``.json``/``.csv``/``.parquet`` are
  read by the ``datasets`` library, and a single file serves both splits;
* a local folder: a ``datasets`` ``save_to_disk`` folder (a DatasetDict's ``train``/``test`` split, ``validation``
  standing in for a missing ``test``; a single Dataset serves both splits), or a folder holding ``train.*`` and
  ``test.*`` files of the kinds above;
* a ``datasets`` hub name — ``wikitext2``, ``c4``, ``pile`` — read the way GPTQ/AWQ/MixLLM read them, when the hub
  (or a local HF cache with HF_HUB_OFFLINE=1) is reachable;
* several of the above joined with ``+`` (``kjv+pydoc``, the recipes' calibration default): equal shares of text
  from each, since calibrating on one narrow domain fits the quantized model to it (GPTQ on a real model lost to
  round-to-nearest on text of another domain, docs/BENCHMARKS.md).

Text is read as UTF-8 only (a leading byte-order mark is dropped): a file with other bytes is refused with the
byte offset of the first one and an ``iconv`` line to convert it, since a guessed encoding silently changes the
tokens and the perplexity.
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.resources import shipped_dir

BUILTIN_CORPORA = {"kjv": "kjv", "builtin": "kjv", "pydoc": "pydoc"}  # name -> calibration/{file}-{split}.txt
BUILTIN_NAMES = tuple(BUILTIN_CORPORA)
HUB_NAMES = ("wikitext2", "c4", "pile")
SPLITS = ("train", "test")
DEFAULT_TEXT_COLUMN = "text"
PARAGRAPH_SUFFIXES = (".txt", ".md", "")
DATASETS_BUILDERS = {".json": "json", ".csv": "csv", ".parquet": "parquet"}  # read by datasets.load_dataset
RECORD_SUFFIXES = (".jsonl",) + tuple(DATASETS_BUILDERS)  # files whose text is one column of each record
SPLIT_FILE_SUFFIXES = (".jsonl", ".txt", ".json", ".csv", ".parquet", ".md")  # train.* / test.* in a folder
_MEMO_SIZE = 2  # local sources read by check_source, kept so the read after the model loads costs nothing
_memo: dict[tuple, list[str]] = {}


MIX = "+"


def known_sources() -> str:
    """The accepted source names, for help texts and errors."""
    return ("kjv or pydoc (shipped), wikitext2, c4, pile, a .txt/.jsonl/.json/.csv/.parquet file, a folder "
            "(datasets save_to_disk, or train.*/test.* files), or several joined with + (e.g. kjv+pydoc)")


def mixed_sources(source: str) -> list[str] | None:
    """The parts of a ``+``-joined source (None for a single source, or for a file or folder whose own name holds
    a ``+``); a QuantkitError for an empty part."""
    if MIX not in source or Path(source).expanduser().exists():
        return None
    parts = source.split(MIX)
    if any(not p.strip() for p in parts):
        raise QuantkitError(f"dataset '{source}' has an empty part; join source names with + (e.g. kjv+pydoc)")
    return parts


def mix_documents(sources: list[list[str]]) -> list[str]:
    """Equal shares of several sources' documents: from each, evenly spaced documents totalling about as many
    characters as the smallest source holds, interleaved one from each source in turn."""
    sizes = [sum(len(d) for d in docs) for docs in sources]
    budget = min(sizes)
    picked = [docs[::max(1, round(size / budget))] if budget else [] for docs, size in zip(sources, sizes)]
    out = []
    for i in range(max(len(p) for p in picked)):
        out.extend(p[i] for p in picked if i < len(p))
    return out


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise QuantkitError(f"unknown split '{split}'; use train or test")


def builtin_text(split: str, name: str = "kjv") -> str:
    """A shipped corpus split (calibration/{kjv,pydoc}-{split}.txt, installed as quantkit.calibration)."""
    _check_split(split)
    folder = shipped_dir("quantkit.calibration", "calibration")
    return folder.joinpath(f"{BUILTIN_CORPORA[name]}-{split}.txt").read_text(encoding="utf-8")


def _not_utf8(path: Path, offset: int, line: int, byte: int) -> QuantkitError:
    return QuantkitError(f"'{path}' is not UTF-8 text: byte {offset} (line {line}) is 0x{byte:02x}; quantkit reads "
                         "UTF-8 only, so convert it first, e.g. iconv -f latin1 -t utf-8 "
                         f"'{path}' > '{path.with_name(path.stem + '.utf8' + path.suffix)}' (with the file's real "
                         "encoding in place of latin1)")


def check_utf8(path: Path) -> None:
    """Refuse a file that is not valid UTF-8, naming the byte offset and line of its first bad byte (read in 1 MiB
    blocks, so large files cost no memory)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0  # bytes fed so far, and the newlines among them
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            pending = decoder.getstate()[0]  # the start of a character split by the block boundary
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                data = pending + block
                raise _not_utf8(path, offset - len(pending) + e.start, lines + data[:e.start].count(b"\n") + 1,
                                data[e.start]) from None
            offset += len(block)
            lines += block.count(b"\n")
        pending = decoder.getstate()[0]
        if pending:  # the file ends inside a character
            raise _not_utf8(path, offset - len(pending), lines + 1, pending[0])


def _read_utf8(path: Path) -> str:
    check_utf8(path)
    return path.read_text(encoding="utf-8-sig")


def _paragraphs(path: Path) -> list[str]:
    return [p for p in _read_utf8(path).split("\n\n") if p.strip()]


def _jsonl_documents(path: Path, column: str) -> list[str]:
    docs = []
    for lineno, line in enumerate(_read_utf8(path).split("\n"), 1):  # JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise QuantkitError(f"{path}:{lineno} is not valid JSON; a .jsonl file needs one object per line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(column), str):
            fields = ", ".join(map(str, obj)) if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
            raise QuantkitError(f"{path}:{lineno} has no string '{column}' field (it has: {fields or 'no fields'}); "
                                "each .jsonl line needs one — name the text field with --text-column")
        docs.append(obj[column])
    return docs


def _quiet_datasets() -> None:
    """datasets' own progress bars and info lines off (quantkit draws its own progress), unless ``quantkit -v``."""
    import datasets

    from quantkit.ui import verbose

    if verbose():
        datasets.enable_progress_bars()
        datasets.logging.set_verbosity_warning()
    else:
        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


def _column_texts(ds, column: str, where: str) -> list[str]:
    """The non-null strings of ``column`` of a datasets.Dataset; a QuantkitError listing the columns when it has
    none of that name or it does not hold text."""
    from datasets import Value

    names = list(ds.column_names)
    if column not in names:
        raise QuantkitError(f"{where} has no column '{column}' (its columns: {', '.join(names) or 'none'}); name the "
                            "text column with --text-column")
    feature = ds.features[column]
    if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
        kind = feature.dtype if isinstance(feature, Value) else type(feature).__name__
        raise QuantkitError(f"column '{column}' of {where} holds {kind}, not text; name the text column with "
                            "--text-column")
    return [t for t in ds[column] if t is not None]


def _datasets_file_documents(path: Path, column: str) -> list[str]:
    """A .json/.csv/.parquet file read by ``datasets.load_dataset`` (its packaged builders, one ``train`` split)."""
    from datasets import load_dataset

    builder = DATASETS_BUILDERS[path.suffix.lower()]
    if builder != "parquet":
        check_utf8(path)
    _quiet_datasets()
    try:
        ds = load_dataset(builder, data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001 - pyarrow/pandas raise many types for a malformed file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise QuantkitError(f"could not read '{path}' as {builder.upper()} ({first}); fix the file or convert it "
                            "to .jsonl") from None
    return _column_texts(ds, column, f"'{path}'")


def is_saved_dataset(folder: Path) -> bool:
    """True when ``folder`` was written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _saved_dataset_documents(folder: Path, split: str, column: str) -> list[str]:
    from datasets import DatasetDict, load_from_disk

    _quiet_datasets()
    try:
        ds = load_from_disk(str(folder))
    except Exception as e:  # noqa: BLE001 - a damaged folder raises whatever arrow/json raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise QuantkitError(f"could not read the datasets folder '{folder}' ({first}); save it again with "
                            "save_to_disk") from None
    if isinstance(ds, DatasetDict):
        names = [split] + (["validation"] if split == "test" else [])
        found = next((n for n in names if n in ds), None)
        if found is None:
            raise QuantkitError(f"datasets folder '{folder}' has no {' or '.join(names)} split (its splits: "
                                f"{', '.join(ds) or 'none'}); save one under that name")
        return _column_texts(ds[found], column, f"split '{found}' of '{folder}'")
    return _column_texts(ds, column, f"'{folder}'")


def _file_documents(path: Path, column: str) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_documents(path, column)
    if suffix in DATASETS_BUILDERS:
        return _datasets_file_documents(path, column)
    if suffix in PARAGRAPH_SUFFIXES:
        return _paragraphs(path)
    raise QuantkitError(f"unsupported text file '{path}'; use a .txt, .jsonl, .json, .csv or .parquet file")


def _local_file_of(path: Path, source: str, split: str) -> Path:
    """The file a local source reads for ``split``: the file itself, or ``split.*`` in a folder."""
    if not path.is_dir():
        return path
    for ext in SPLIT_FILE_SUFFIXES:
        f = path / f"{split}{ext}"
        if f.is_file():
            return f
    raise QuantkitError(f"folder '{source}' has no {split}.txt/.jsonl/.json/.csv/.parquet and is not a datasets "
                        "save_to_disk folder")


def _stamp(path: Path) -> tuple:
    """What must be unchanged for a memoized read of ``path`` (a file, or every file under a folder) to hold."""
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)


def local_documents(source: str, split: str, text_column: str | None = None) -> list[str]:
    """Documents of a local file or folder (see the module doc), refused when they hold no text."""
    column = text_column or DEFAULT_TEXT_COLUMN
    path = Path(source).expanduser()
    saved = path.is_dir() and is_saved_dataset(path)
    target = path if saved else _local_file_of(path, source, split)
    key = (str(target.resolve()), split if saved or target != path else None, column, _stamp(target))
    if key in _memo:
        return list(_memo[key])
    docs = _saved_dataset_documents(path, split, column) if saved else _file_documents(target, column)
    if not any(d.strip() for d in docs):
        what = f"'{target}'" if target.suffix.lower() in PARAGRAPH_SUFFIXES and not saved else \
            f"column '{column}' of '{target}'"
        raise QuantkitError(f"dataset '{source}' ({split} split) has no text: {what} is empty; put text in it, or pass "
                            "another dataset")
    _memo[key] = docs
    while len(_memo) > _MEMO_SIZE:
        del _memo[next(iter(_memo))]
    return list(docs)


def _hub_unreachable(name: str) -> QuantkitError | None:
    """The error for a hub dataset when the hub is on but cannot be reached (None when offline or reachable):
    datasets would retry for about 25 s and then name only the hub."""
    from quantkit import hub

    if hub.hub_offline(datasets=True):
        return None
    reason = hub.hub_unreachable_reason()
    if reason is None:
        return None
    return QuantkitError(f"could not load dataset '{name}': the hub {hub.hub_endpoint()} could not be reached "
                         f"({reason}); set HF_HUB_OFFLINE=1 to read a copy in the local HF cache, pass a local file "
                         "or folder, or use kjv or pydoc (shipped)")


def _hub_documents(name: str, split: str) -> list[str]:
    """wikitext-2-raw-v1 (train/test), c4 (GPTQ's en shards: train 00000, validation 00000), pile (AWQ's val
    backup: validation for both splits)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise QuantkitError(f"dataset '{name}' needs the 'datasets' package (pip install datasets), "
                            "or pass a local .txt/.jsonl file") from None
    unreachable = _hub_unreachable(name)
    if unreachable is not None:
        raise unreachable
    _quiet_datasets()
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
                            "cached — pass a local .txt/.jsonl file with --dataset PATH, or use --dataset kjv or "
                            "pydoc") from None


def has_columns(source: str) -> bool:
    """True when ``source`` is a local file or folder whose records have named columns (what --text-column picks)."""
    parts = mixed_sources(source)
    if parts is not None:
        return any(has_columns(p) for p in parts)
    path = Path(source).expanduser()
    return path.is_dir() or (path.is_file() and path.suffix.lower() in RECORD_SUFFIXES)


def check_text_column(text_column: str | None, sources: list[str | None]) -> None:
    """Refuse a --text-column that is empty, or that no source of the command reads (only record files and
    folders have columns; the shipped corpus, hub names and .txt files do not)."""
    if text_column is None:
        return
    if not text_column.strip():
        raise QuantkitError("--text-column is empty; name the column that holds the text")
    given = [s for s in sources if s is not None]
    if not any(has_columns(s) for s in given):
        raise QuantkitError(f"--text-column picks the text column of a .jsonl/.json/.csv/.parquet file or a "
                            f"datasets folder; {', '.join(repr(s) for s in given) or 'this command'} has no columns, "
                            "so drop it")


def check_source(source: str, split: str = "train", text_column: str | None = None) -> None:
    """Refuse, before a command loads its model, a source that cannot give text: an unknown name, a missing path, a
    hub name while the hub is on but unreachable, a local file that is not UTF-8, lacks the text column or holds
    no text (local sources are read here, and the read is kept for :func:`documents`)."""
    from quantkit.hub import looks_like_path

    parts = mixed_sources(source)
    if parts is not None:
        for part in parts:
            check_source(part, split, text_column)
        return
    if source in BUILTIN_NAMES:
        return
    if source in HUB_NAMES:
        unreachable = _hub_unreachable(source)
        if unreachable is not None:
            raise unreachable
        return
    path = Path(source).expanduser()
    if path.exists():
        _check_split(split)
        local_documents(source, split, text_column)
        return
    if looks_like_path(source) or "." in source or os.sep in source:
        raise QuantkitError(f"dataset '{source}' does not exist (no such file or folder: {path.absolute()}); pass "
                            "an existing file or folder")
    raise QuantkitError(f"unknown dataset '{source}' (and no file or folder of that name here); use "
                        f"{known_sources()}")


def documents(source: str, split: str, text_column: str | None = None) -> list[str]:
    """The documents of a source split (see module doc for the accepted names); ``text_column`` (default ``text``)
    is the column read from record files and datasets folders."""
    _check_split(split)
    parts = mixed_sources(source)
    if parts is not None:
        return mix_documents([documents(part, split, text_column) for part in parts])
    if source in BUILTIN_NAMES:
        return [p for p in builtin_text(split, source).split("\n\n") if p.strip()]
    check_source(source, split, text_column)
    if source in HUB_NAMES:
        return _hub_documents(source, split)
    return local_documents(source, split, text_column)


def joined_text(source: str, split: str, text_column: str | None = None) -> str:
    """Documents joined with "\\n\\n", the way GPTQ/MixLLM build their evaluation text."""
    return "\n\n".join(documents(source, split, text_column))
