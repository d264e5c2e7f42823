"""What a torch.profiler run over a few steps says: device busy time, kernels per step, the top ops.

Host ops' device time is left out of the device figures (it would count each kernel twice).
"""

from collections.abc import Callable
from typing import Any

from torch.autograd import DeviceType


def profile_summary(events: Any, num_steps: int, top: int = 15) -> dict[str, object]:
    """`events`: a profiler's `key_averages()` over `num_steps` steps."""
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    return {
        "device_busy_ms_per_step": round(sum(_device_us(e) for e in kernels) / num_steps / 1e3, 3),
        "kernels_per_step": round(sum(e.count for e in kernels) / num_steps, 1),
        "top_device_ops": _top(kernels, _device_us, num_steps, top),
        "top_host_ops": _top([e for e in events if e.device_type != DeviceType.CUDA],
                             lambda e: float(e.self_cpu_time_total), num_steps, top),
    }


def _device_us(event: Any) -> float:
    return float(getattr(event, "self_device_time_total", 0.0) or getattr(event, "device_time_total", 0.0))


def _top(events: list[Any], key: Callable[[Any], float], num_steps: int, n: int) -> list[dict[str, object]]:
    ranked = sorted(events, key=key, reverse=True)[:n]
    return [{"name": e.key[:90], "ms_per_step": round(key(e) / num_steps / 1e3, 4),
             "calls_per_step": round(e.count / num_steps, 1)} for e in ranked if key(e) > 0]
