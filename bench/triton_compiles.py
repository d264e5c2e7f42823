"""Counts Triton kernel variants built while a measured run is going (a context manager).

A kernel variant that is first needed inside a timed run (a new specialization of an integer
argument, a new constexpr) is compiled or loaded from Triton's disk cache right there, which costs
tens of milliseconds to a second of host time: a run reporting any has measured that, not the engine.
Uses Triton's post-compile hook (triton.knobs, Triton 3.4 and later); elsewhere it records nothing
and says so (`supported` is False).
"""

from collections import Counter
from typing import Any


class TritonCompiles:
    def __init__(self) -> None:
        self.kernels: Counter[str] = Counter()
        self.supported = False
        self._knobs: Any = None
        self._previous: Any = None

    def __enter__(self) -> "TritonCompiles":
        try:
            from triton import knobs
        except ImportError:
            return self
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return self
        self._knobs, self._previous, self.supported = runtime, runtime.jit_post_compile_hook, True
        runtime.jit_post_compile_hook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if self._knobs is not None:
            self._knobs.jit_post_compile_hook = self._previous

    def _hook(self, **kwargs: Any) -> bool | None:
        self.kernels[str(getattr(kwargs.get("fn"), "name", "?"))] += 1
        return self._previous(**kwargs) if self._previous is not None else None

    def summary(self) -> dict[str, object]:
        return {"supported": self.supported, "count": sum(self.kernels.values()), "kernels": dict(self.kernels)}
