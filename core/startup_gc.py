"""Once an engine is built, what start-up left alive goes out of the garbage collector's sight.

Start-up leaves hundreds of thousands of long-lived objects (torch, triton, transformers, the tokenizer, the
model's modules). Each of Python's full collections walks all of them while holding the interpreter lock, a pause
of a tenth of a second or more that lands between two tokens of every running request. Frozen, they are
never walked again (vLLM freezes after start-up too); garbage made later is collected as before. They are
unfrozen when the interpreter exits, before it frees what is left: frozen objects would outlive it, and extension
modules check that none did (triton's nanobind bindings print a leak report of each one still alive, after
everything else the process printed).
"""

import atexit
import gc


def freeze_startup_objects() -> int:
    """Collects what start-up left as garbage, freezes everything alive; returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many times this runs
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()
