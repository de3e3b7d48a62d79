"""Model loading, the decoder-layer/linear walk, and layer-by-layer execution."""

from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output, run_layerwise
from quantkit.model.loader import LoadedModel, builtin_model_dir, load_model, resolve_device, resolve_dtype
from quantkit.model.walk import find_decoder_layers, iter_linears, layer_linears, projection_kind, set_module

__all__ = ["LayerBatch", "LoadedModel", "builtin_model_dir", "capture_layer_inputs", "find_decoder_layers",
           "iter_linears", "layer_linears", "layer_output", "load_model", "projection_kind", "resolve_device",
           "resolve_dtype", "run_layerwise", "set_module"]
