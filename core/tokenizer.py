"""Loading the model's tokenizer, for the server and the offline LLM: the engine knows token ids only.

Every common format loads: tokenizer.json, sentencepiece `tokenizer.model`, vocab.json + merges.txt,
and tiktoken BPE files. transformers reads all of them itself when the tiktoken file is called
`tiktoken.model` (or is a `tokenizer.model` that sentencepiece cannot read); a tiktoken file under
another name (`cl100k_base.tiktoken`, `qwen.tiktoken`) is converted here, with transformers' own
tiktoken converter, the special tokens and chat template taken from tokenizer_config.json.
"""

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

# Files from which transformers builds a tokenizer without help.
_KNOWN_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    tiktoken_file = _lone_tiktoken_file(Path(path))
    if tiktoken_file is None:
        return AutoTokenizer.from_pretrained(path)
    return _from_tiktoken(tiktoken_file)


def _lone_tiktoken_file(directory: Path) -> Path | None:
    if not directory.is_dir() or any((directory / name).is_file() for name in _KNOWN_FILES):
        return None
    files = sorted(directory.glob("*.tiktoken"))
    return files[0] if len(files) == 1 else None


def _from_tiktoken(vocab_file: Path) -> PreTrainedTokenizerFast:
    """Special tokens follow the base vocabulary in id order, as tokenizer_config.json's added_tokens_decoder
    numbers them; a gap would shift every id after it, so it is refused."""
    config_file = vocab_file.parent / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    added = {int(i): t["content"] if isinstance(t, dict) else str(t)
             for i, t in config.get("added_tokens_decoder", {}).items()}
    base_size = len(TikTokenConverter.load_tiktoken_bpe(str(vocab_file)))
    specials = [added[i] for i in sorted(added)]
    if sorted(added) != list(range(base_size, base_size + len(added))):
        raise ValueError(f"{config_file}: added tokens must take ids {base_size}.. in order, after the "
                         f"{base_size} tokens of {vocab_file.name}; got {sorted(added)}")
    converter = TikTokenConverter(str(vocab_file), extra_special_tokens=specials,
                                  **({"pattern": config["pat_str"]} if "pat_str" in config else {}))
    template_file = vocab_file.parent / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
    return PreTrainedTokenizerFast(tokenizer_object=converter.converted(), chat_template=template,
                                   **{name: config[name] for name in _SPECIAL_NAMES if config.get(name)})
