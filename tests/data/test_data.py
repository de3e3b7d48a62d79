"""Text sources and deterministic calibration windows."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.data import calibration_windows, documents, eval_token_stream
from quantkit.data.sources import builtin_text
from quantkit.errors import QuantkitError
from tests.conftest import shipped_tokenizer


@pytest.fixture(autouse=True)
def _datasets_cache_in_tmp(tmp_path, monkeypatch):
    """datasets prepares every file it reads in its cache; keep the tests' copies out of the user's."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


def test_shipped_corpus_is_real_and_split():
    train, test = builtin_text("train"), builtin_text("test")
    assert len(train.encode()) + len(test.encode()) >= 2_000_000
    assert "In the beginning God created the heaven and the earth." in train
    # the splits hold different chapters
    assert not set(train.split("\n\n")[:50]) & set(test.split("\n\n"))


def test_pydoc_corpus_is_shipped_split_and_rebuildable():
    """The generic-domain corpus: Python reference text, test sections held out, and (on the Python release that
    made it) rebuilt byte for byte by calibration/make_pydoc_corpus.py."""
    import importlib.util
    import sys
    from pathlib import Path

    train, test = builtin_text("train", "pydoc"), builtin_text("test", "pydoc")
    assert "assignment" in train and len(test) > 70_000
    assert not set(train.split("\n\n")) & set(test.split("\n\n"))
    assert documents("pydoc", "test") == [p for p in test.split("\n\n") if p.strip()]
    spec = importlib.util.spec_from_file_location("make_pydoc", Path(__file__).parents[2] / "calibration" /
                                                  "make_pydoc_corpus.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    sections = make.sections()
    if sys.version_info[:2] == (3, 11):
        assert "\n\n".join(s for i, s in enumerate(sections) if i % 5 == 4) + "\n" == test


def test_sources_joined_with_plus_mix_in_equal_shares(tmp_path):
    """kjv+pydoc (the recipes' default) takes about as many characters from each source, interleaved; a file whose
    own name holds a + stays one source; an empty part or an unknown part is refused before any model loads."""
    from quantkit.data.sources import check_source

    mixed = documents("kjv+pydoc", "train")
    kjv = set(builtin_text("train").split("\n\n"))
    from_kjv = sum(len(d) for d in mixed if d in kjv)
    from_pydoc = sum(len(d) for d in mixed if d not in kjv)
    assert 0.8 < from_kjv / from_pydoc < 1.25
    assert mixed[0] in kjv and mixed[1] not in kjv  # interleaved in the order given
    plus = tmp_path / "a+b.txt"
    plus.write_text("one paragraph\n\nanother")
    assert documents(str(plus), "train") == ["one paragraph", "another"]
    with pytest.raises(QuantkitError, match="empty part"):
        check_source("kjv+")
    with pytest.raises(QuantkitError, match="unknown dataset 'nope'"):
        check_source("kjv+nope")


def test_windows_are_deterministic_and_shaped():
    tok = shipped_tokenizer()
    a = calibration_windows(tok, "kjv", n=5, seqlen=64, seed=3)
    b = calibration_windows(tok, "kjv", n=5, seqlen=64, seed=3)
    c = calibration_windows(tok, "kjv", n=5, seqlen=64, seed=4)
    assert a.shape == (5, 64) and a.dtype == torch.long
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_local_txt_and_jsonl(tmp_path):
    txt = tmp_path / "my.txt"
    txt.write_text("first paragraph here.\n\nsecond one, longer than the first.\n")
    assert documents(str(txt), "train") == ["first paragraph here.", "second one, longer than the first.\n"]
    jl = tmp_path / "my.jsonl"
    jl.write_text(json.dumps({"text": "alpha beta"}) + "\n" + json.dumps({"text": "gamma"}) + "\n")
    assert documents(str(jl), "test") == ["alpha beta", "gamma"]
    tok = shipped_tokenizer()
    assert eval_token_stream(tok, str(jl)).numel() > 0


def test_directory_with_splits(tmp_path):
    (tmp_path / "train.txt").write_text("a b c")
    (tmp_path / "test.jsonl").write_text(json.dumps({"text": "d e f"}) + "\n")
    assert documents(str(tmp_path), "train") == ["a b c"]
    assert documents(str(tmp_path), "test") == ["d e f"]


def test_bad_jsonl_names_the_line(tmp_path):
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "ok"}\n{"no_text": 1}\n')
    with pytest.raises(QuantkitError, match=r"bad.jsonl:2 has no string 'text'"):
        documents(str(jl), "train")


def test_unknown_and_missing_sources(tmp_path):
    with pytest.raises(QuantkitError, match="unknown dataset 'nosuch'"):
        documents("nosuch", "train")
    with pytest.raises(QuantkitError, match="does not exist"):
        documents(str(tmp_path / "missing.txt"), "train")


def test_hub_dataset_offline_points_at_local_files(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(QuantkitError, match="local .txt/.jsonl"):
        documents("wikitext2", "test")


def test_text_too_short_for_one_window(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("just a few words")
    with pytest.raises(QuantkitError, match="fewer than one window"):
        calibration_windows(shipped_tokenizer(), str(f), n=2, seqlen=512)


# --- UTF-8 only -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,head", [("latin.txt", b"first line\n\n"), ("latin.jsonl", b'{"text": "ok"}\n'),
                                       ("latin.csv", b"text\nok\n"), ("latin.json", b'{"text": "ok"}\n')])
def test_a_file_that_is_not_utf8_is_refused_with_its_byte_offset(tmp_path, name, head):
    """A latin-1 file was decoded with replacement characters and gave a perplexity of 20 million, exit 0."""
    f = tmp_path / name
    bad = ("caf\u00e9" + ("\n" if name.endswith(".txt") else "")).encode("latin-1")
    if name.endswith(".jsonl") or name.endswith(".json"):
        bad = b'{"text": "' + "caf\u00e9".encode("latin-1") + b'"}\n'
    elif name.endswith(".csv"):
        bad = "caf\u00e9\n".encode("latin-1")
    f.write_bytes(head + bad)
    offset, line = len(head) + bad.index(b"\xe9"), head.count(b"\n") + 1
    with pytest.raises(QuantkitError, match=rf"^'.*{name}' is not UTF-8 text: byte {offset} \(line {line}\) is 0xe9; "
                                            r"quantkit reads UTF-8 only, so convert it first, e\.g\. iconv -f latin1 "
                                            r"-t utf-8 '.*' > '.*latin\.utf8\.\w+' \(with the file's real encoding "
                                            r"in place of latin1\)$"):
        documents(str(f), "test")


def test_utf8_checks_across_block_boundaries_and_the_end(tmp_path):
    from quantkit.data.sources import check_utf8

    f = tmp_path / "big.txt"
    f.write_bytes(b"a" * ((1 << 20) - 1) + "\u00e9 fine".encode())  # a character split by the 1 MiB block edge
    check_utf8(f)
    f.write_bytes(b"ab\n" + "\u00e9".encode()[:1])  # ends inside a character
    with pytest.raises(QuantkitError, match=r"byte 3 \(line 2\) is 0xc3"):
        check_utf8(f)


def test_a_utf8_byte_order_mark_is_dropped(tmp_path):
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfhello there")
    assert documents(str(f), "train") == ["hello there"]


# --- empty sources --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,content,what", [("empty.txt", "", "'.*empty.txt'"),
                                               ("blank.txt", "\n\n  \n", "'.*blank.txt'"),
                                               ("empty.jsonl", '{"text": ""}\n', "column 'text' of '.*empty.jsonl'")])
def test_an_empty_source_names_the_file_and_the_fix(tmp_path, name, content, what):
    """The empty-dataset error suggested a smaller --seqlen, after the model had loaded."""
    from quantkit.data import check_source

    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(QuantkitError, match=rf"^dataset '.*{name}' \(train split\) has no text: {what} is empty; "
                                            "put text in it, or pass another dataset$"):
        check_source(str(f))  # what commands call before the model loads


def test_check_source_reads_once_and_rereads_a_changed_file(tmp_path):
    from quantkit.data import check_source

    f = tmp_path / "t.txt"
    f.write_text("one\n\ntwo")
    check_source(str(f))
    assert documents(str(f), "train") == ["one", "two"]
    f.write_text("three and more")
    assert documents(str(f), "train") == ["three and more"]


def test_a_missing_path_says_no_such_file_or_folder(tmp_path):
    with pytest.raises(QuantkitError, match=r"dataset '.*calib\.parquet' does not exist \(no such file or folder: "):
        documents(str(tmp_path / "calib.parquet"), "train")
    with pytest.raises(QuantkitError, match=r"dataset 'data/mine' does not exist"):
        documents("data/mine", "train")


def test_a_hub_dataset_with_the_hub_unreachable_fails_at_once(monkeypatch):
    """datasets retried for about 25 s before naming the hub; one probe answers at once."""
    import time

    from quantkit import hub

    monkeypatch.setattr(hub, "hub_offline", lambda datasets=False: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: "Name or service not known")
    start = time.perf_counter()
    with pytest.raises(QuantkitError, match=r"could not load dataset 'wikitext2': the hub \S+ could not be reached "
                                            r"\(Name or service not known\); set HF_HUB_OFFLINE=1"):
        documents("wikitext2", "test")
    assert time.perf_counter() - start < 1


# --- record files and datasets folders (--text-column) -----------------------------------------------------------

def _records():
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict({"content": ["alpha beta", None, "gamma"], "id": [1, 2, 3]})


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_parquet_csv_and_json_files_read_their_text_column(tmp_path, suffix):
    ds = _records()
    f = tmp_path / f"calib{suffix}"
    {".parquet": ds.to_parquet, ".csv": lambda p: ds.to_csv(p, index=False), ".json": ds.to_json}[suffix](str(f))
    assert documents(str(f), "train", text_column="content") == ["alpha beta", "gamma"]  # missing cells dropped
    with pytest.raises(QuantkitError, match=r"has no column 'text' \(its columns: content, id\); name the text "
                                            "column with --text-column"):
        documents(str(f), "train")
    with pytest.raises(QuantkitError, match=r"column 'id' of '.*' holds int64, not text"):
        documents(str(f), "train", text_column="id")


def test_a_json_array_file_and_a_jsonl_column(tmp_path):
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"body": "x y"}, {"body": "z"}]))
    assert documents(str(arr), "test", text_column="body") == ["x y", "z"]
    jl = tmp_path / "b.jsonl"
    jl.write_text(json.dumps({"body": "p q", "id": 1}) + "\n")
    assert documents(str(jl), "test", text_column="body") == ["p q"]
    with pytest.raises(QuantkitError, match=r"b.jsonl:1 has no string 'text' field \(it has: body, id\)"):
        documents(str(jl), "test")
    sep = tmp_path / "c.jsonl"  # U+2028 is a line break to str.splitlines, not to JSON lines
    sep.write_text(json.dumps({"text": "one\u2028two"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert documents(str(sep), "test") == ["one\u2028two"]


def test_a_save_to_disk_folder_gives_its_splits(tmp_path):
    import datasets

    ds = _records()
    datasets.DatasetDict({"train": ds, "validation": ds.select([2])}).save_to_disk(str(tmp_path / "dd"))
    assert documents(str(tmp_path / "dd"), "train", "content") == ["alpha beta", "gamma"]
    assert documents(str(tmp_path / "dd"), "test", "content") == ["gamma"]  # validation stands in for test
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "only-train"))
    with pytest.raises(QuantkitError, match=r"datasets folder '.*only-train' has no test or validation split "
                                            r"\(its splits: train\)"):
        documents(str(tmp_path / "only-train"), "test", "content")
    ds.save_to_disk(str(tmp_path / "single"))  # one Dataset serves both splits
    assert documents(str(tmp_path / "single"), "test", "content") == ["alpha beta", "gamma"]


def test_a_folder_of_split_files_of_any_kind(tmp_path):
    ds = _records()
    ds.to_parquet(str(tmp_path / "train.parquet"))
    (tmp_path / "test.csv").write_text("content\nfrom the csv\n")
    assert documents(str(tmp_path), "train", "content") == ["alpha beta", "gamma"]
    assert documents(str(tmp_path), "test", "content") == ["from the csv"]


def test_calibration_windows_from_a_parquet_column(tmp_path):
    import datasets

    text = builtin_text("train")[:20000].split("\n\n")
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"body": text}).to_parquet(str(tmp_path / "c.parquet"))
    ids = calibration_windows(shipped_tokenizer(), str(tmp_path / "c.parquet"), n=2, seqlen=64, text_column="body")
    assert ids.shape == (2, 64)


def test_text_column_is_refused_where_no_source_has_columns(tmp_path):
    from quantkit.data import check_text_column

    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.csv").write_text("body\ny\n")
    check_text_column(None, ["kjv"])
    check_text_column("body", [str(tmp_path / "a.txt"), str(tmp_path / "b.csv")])
    with pytest.raises(QuantkitError, match=r"--text-column picks the text column of a .jsonl/.json/.csv/.parquet "
                                            r"file or a datasets folder; 'kjv', '.*a.txt' has no columns, so drop it"):
        check_text_column("body", ["kjv", str(tmp_path / "a.txt"), None])
    with pytest.raises(QuantkitError, match="--text-column is empty"):
        check_text_column(" ", [str(tmp_path / "b.csv")])


def test_quantize_calibration_reads_and_records_the_text_column(tmp_path):
    import datasets

    from quantkit.quant.apply import calibration_inputs
    from quantkit.quant.recipe import load_recipe

    datasets.Dataset.from_dict({"body": builtin_text("train")[:20000].split("\n\n")}).to_parquet(
        str(tmp_path / "c.parquet"))
    ids, info = calibration_inputs(shipped_tokenizer(), load_recipe("gptq-w4a16-g128"), 256,
                                   dataset=str(tmp_path / "c.parquet"), samples=2, seqlen=32, text_column="body")
    assert ids.shape == (2, 32) and info["text_column"] == "body" and info["dataset"].endswith("c.parquet")
