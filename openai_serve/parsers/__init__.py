"""The model's text in, the parts of an assistant message out: content, reasoning, tool calls.

Every parser takes the answer in pieces (`feed`) and hands out deltas (deltas.py) as soon as they
are settled, then what was waiting (`finish`). A response in full is the fold of the same deltas,
so a stream and a response in full always agree.
"""
