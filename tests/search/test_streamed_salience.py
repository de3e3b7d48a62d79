"""The salience pass with the weights in CPU memory and one decoder layer at a time on the compute device
(``quantkit search --max-gpu-memory``): the same per-sample gradients as the whole-model pass, so the same scores and
the same plan; what cannot stream is refused in one line."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.search.salience import compute_salience


def _quantizer(name: str, w: torch.Tensor) -> torch.Tensor:
    from quantkit.quant.grid import fake_quantize

    return fake_quantize(w, 4, 32)


@pytest.mark.parametrize("arch,over", [("llama", {}), ("llama", {"tie_word_embeddings": True}), ("qwen3_moe", {})])
def test_streamed_salience_equals_the_whole_model_pass(arch, over):
    from tests.conftest import build_tiny_model

    model = build_tiny_model(arch, **over)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    whole = compute_salience(model, ids, _quantizer, batch_size=2, checkpoint_layers=False)
    streamed = compute_salience(model, ids, _quantizer, batch_size=2, stream_device="cpu")
    assert whole.scores.keys() == streamed.scores.keys()
    for name in whole.scores:  # the same operations, one layer at a time: bit for bit
        assert torch.equal(streamed.scores[name], whole.scores[name]), name


def test_chunks_of_several_batches_give_the_same_scores():
    """Several batches per move of the weights: each window's gradient lands in its own probe row."""
    from tests.conftest import build_tiny_model

    model = build_tiny_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (7, 12), generator=torch.Generator().manual_seed(1))
    whole = compute_salience(model, ids, _quantizer, batch_size=2, checkpoint_layers=False)
    for windows in (4, 5, 7):  # 5 rounds down to two batches of 2
        streamed = compute_salience(model, ids, _quantizer, batch_size=2, stream_device="cpu", stream_windows=windows)
        for name in whole.scores:
            assert torch.equal(streamed.scores[name], whole.scores[name]), (windows, name)


def test_stream_chunk_is_bounded_by_cpu_memory_and_whole_batches():
    from quantkit.search.salience import STREAM_BOUNDARY_MAX, stream_chunk

    assert stream_chunk(128, 1, 2**30, 64 * 2**30) == 16  # a quarter of 64 GiB, one GiB a window
    assert stream_chunk(128, 4, 2**30, 64 * 2**30) == 16
    assert stream_chunk(128, 4, 2**30, 2**30) == 4  # never less than one batch
    assert stream_chunk(10, 4, 2**20, 64 * 2**30) == 10  # never more than all windows
    assert stream_chunk(10**6, 1, 2**20, None) == STREAM_BOUNDARY_MAX // 2**20


def test_a_search_streaming_the_layers_writes_the_same_plan(tiny_model_dir, tmp_path):
    import json

    from quantkit.model import load_model
    from quantkit.quant.recipe import load_recipe
    from quantkit.search.allocate import BitBudget
    from quantkit.search.run import SearchOptions, search

    src = str(tiny_model_dir("llama"))
    plans = []
    for stream in (None, "cpu"):
        loaded = load_model(src, device="cpu")
        opts = SearchOptions(budget=BitBudget.parse([4, 8], 4.4, None), samples=3, seqlen=16, stream_device=stream)
        plan, _ = search(loaded, load_recipe("mixllm-w4a8-rtn"), opts)
        plan.save(tmp_path / f"{stream}.json")
        plans.append(json.loads((tmp_path / f"{stream}.json").read_text())["layers"])
    assert plans[0] == plans[1]


def test_max_gpu_memory_refusals(tiny_model_dir, tmp_path):
    from quantkit.search.command import run_search

    src = str(tiny_model_dir("llama"))
    with pytest.raises(QuantkitError, match="no CUDA GPU is visible" if not torch.cuda.is_available() else
                       "use --device cuda"):
        run_search(src, str(tmp_path / "p.json"), max_gpu_memory="1GiB", device="cpu", show_progress=False)
    with pytest.raises(QuantkitError, match="--max-gpu-memory 'lots' is not a size"):
        run_search(src, str(tmp_path / "p.json"), max_gpu_memory="lots", device="cpu", show_progress=False)


def test_the_streamed_search_sizes_its_chunk_and_refuses_what_cannot_fit(tiny_model_dir, monkeypatch):
    """The CLI's checks on a (pretended) CUDA machine: the chunk is whole batches within the windows, and a cap or
    CPU memory too small is a one-line refusal."""
    import quantkit.model.loader as loader
    import quantkit.model.memory as memory
    from quantkit.quant.recipe import load_recipe
    from quantkit.search.command import _check_streamed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loader, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(loader, "resolve_dtype", lambda dtype, device, source: torch.float16)
    src, rec = str(tiny_model_dir("llama")), load_recipe("mixllm-w4a8-rtn")
    dev, dtype, chunk = _check_streamed(src, rec, "cuda", None, None, "global", "1GiB", 2, 16, 7)
    assert (dev, dtype) == ("cuda", "float16") and 2 <= chunk <= 7
    with pytest.raises(QuantkitError, match="still needs about"):
        _check_streamed(src, rec, "cuda", None, None, "global", "1KiB", 2, 16, 7)
    monkeypatch.setattr(memory, "free_memory", lambda device: 1024)
    with pytest.raises(QuantkitError, match="keeps the model and its Δ in CPU memory"):
        _check_streamed(src, rec, "cuda", None, None, "global", "1GiB", 2, 16, 7)

