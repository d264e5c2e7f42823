"""Where a model comes from: a checkpoint directory, a GGUF file, a Hub id or a built-in name.

Everything here ends in a Hugging Face checkpoint directory (config.json, safetensors, tokenizer
files), the one format the engine loads. A GGUF is converted once into such a directory in the
cache, keyed by the file's hash and the serving dtype, so later starts load the converted copy.
"""

from core.model_files.errors import ModelNotFound, ModelUnavailable
from core.model_files.resolve import ResolvedModel, resolve_model, with_resolved_model

__all__ = ["ModelNotFound", "ModelUnavailable", "ResolvedModel", "resolve_model", "with_resolved_model"]
