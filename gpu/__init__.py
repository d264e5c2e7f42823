"""Execution on a torch device: tensors in, token ids out. Never imports `core` or `openai_serve`."""
