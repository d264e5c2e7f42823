"""transformers' own reading of a real GGUF file (the oracle of our conversion), kept in the user's cache.

transformers' `gguf_file=` loader parses the file's whole vocabulary in Python for the tokenizer and again for the
model: most of a minute for Gemma 3's 262k tokens. What it returns is saved once (model and tokenizer, as
transformers saves them) under a name made of the file's digest and transformers' version, so a later run reloads
the same oracle and a new file or a new transformers reads the GGUF again. Written aside and renamed into place.
"""

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from core.model_files.cache import DEFAULT_CACHE_DIR, building, file_sha256


def transformers_from_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """transformers' float32 model and tokenizer of `gguf_path`, read from the GGUF the first time only."""
    saved = DEFAULT_CACHE_DIR / "transformers-gguf" / f"{file_sha256(gguf_path)[:16]}-{transformers.__version__}"
    if not (saved / "config.json").is_file():
        with building(saved) as scratch:
            _read_gguf(gguf_path, scratch)
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(saved)


def _read_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Saved as a plain float32 checkpoint: transformers refuses to save a model it read from a GGUF, whose config
    still names the file's quantization, though the weights it holds are dequantized."""
    AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    save_model(model, str(out_dir / "model.safetensors"))  # one copy of tied weights, as transformers saves them
    model.generation_config.save_pretrained(out_dir)
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
