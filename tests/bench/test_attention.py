"""``quantkit bench --attention``: its options are checked before anything runs, head shapes come from a preset or
a model's config, and on a GPU every point has the kernel's and SDPA's times."""

from __future__ import annotations

import pytest
import torch

from quantkit.bench.attention import attention_table, cache_bytes, run_attention
from quantkit.bench.command import heads_of
from quantkit.bench.command import attention_args
from quantkit.errors import QuantkitError


def test_heads_come_from_a_preset_or_the_models_config():
    a = attention_args(None, "llama-3.1-8b", "1,8", "1024", None, {})
    assert a.heads == (32, 8, 128) and a.batches == (1, 8) and a.contexts == (1024,) and a.reps == 20
    b = attention_args("builtin:reference", None, None, None, 3, {})
    from quantkit.model.loader import load_config

    assert b.heads == heads_of(load_config("builtin:reference")) and b.reps == 3
    assert b.contexts == (1024, 4096, 32768, 131072)


@pytest.mark.parametrize("args,message", [
    ((None, None, None, None, None, {}), "needs the head shapes"),
    (("builtin:reference", "llama-3.1-8b", None, None, None, {}), "not both"),
    ((None, "gpt-5", None, None, None, {}), "unknown --preset 'gpt-5'"),
    ((None, "llama-3.1-8b", "0", None, None, {}), "--batch"),
    ((None, "llama-3.1-8b", None, "1", None, {}), "--contexts"),
    ((None, "llama-3.1-8b", None, None, None, {"--e2e": True, "--m": "1"}), "--e2e, --m do not apply"),
])
def test_misuse_is_one_line(args, message):
    with pytest.raises(QuantkitError, match=message):
        attention_args(*args)


def test_cache_bytes_are_keys_and_values_in_fp16():
    assert cache_bytes(8, 32768, 8, 128) == 2 * 8 * 8 * 32768 * 128 * 2  # 1.07 GB per layer


def test_the_table_shows_skipped_points():
    rows = [{"batch": 64, "context": 131072, "q_heads": 32, "kv_heads": 8, "head_dim": 128,
             "skipped": "a 64.0 GiB cache is over the GPU memory budget"}]
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(attention_table(rows))
    assert "over the GPU memory budget" in console.export_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing needs a GPU")
def test_a_gpu_point_times_the_kernel_and_sdpa():
    rows = run_attention((8, 2, 64), [2], [512], reps=3)
    r = rows[0]
    assert r["kernel_us"] > 0 and r["sdpa_us"] > 0 and r["chosen_us"] > 0 and r["gb_s"] > 0
    assert r["kv8_us"] > 0 and r["kv4_us"] > 0 and r["kv4_mb"] < r["kv8_mb"] < r["cache_mb"]
