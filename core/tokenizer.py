"""Loading the model's tokenizer, for the server and the offline LLM: the engine knows token ids only."""

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)
