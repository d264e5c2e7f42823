"""The model's text in, the parts of an assistant message out: content, reasoning, tool calls.

Every parser takes the answer in pieces (`feed`) and hands out deltas (deltas.py) as soon as they
are settled, then what was waiting (`finish`). A response in full is the fold of the same deltas,
so a stream and a response in full always agree.

Each tool-call format has a module (its syntax, its parser, the lazy grammar of its calls, what in a
chat template shows it); tool_parsers.py lists them, selection.py picks a request's parsers and what
they need of its sampling. The families that write calls alike share a reader: xml_calls.py
(Qwen3-Coder, GLM), marked_calls.py (DeepSeek, Kimi, Mistral), json_calls.py (hermes, llama3_json).
"""
