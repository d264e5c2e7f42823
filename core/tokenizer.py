"""Loading the model's tokenizer. The engine never tokenizes; it only hands the tokenizer out."""

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)
