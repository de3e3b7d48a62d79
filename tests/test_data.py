"""Text sources and deterministic calibration windows."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.data import calibration_windows, documents, eval_token_stream
from quantkit.data.sources import builtin_text
from quantkit.errors import QuantkitError
from tests.conftest import shipped_tokenizer


def test_shipped_corpus_is_real_and_split():
    train, test = builtin_text("train"), builtin_text("test")
    assert len(train.encode()) + len(test.encode()) >= 2_000_000
    assert "In the beginning God created the heaven and the earth." in train
    # the splits hold different chapters
    assert not set(train.split("\n\n")[:50]) & set(test.split("\n\n"))


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
