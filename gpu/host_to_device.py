"""Host-to-device copies that never make the host wait for the device.

A copy from pageable host memory may synchronize with the stream (the driver stages it), which
would stall the host until the device finishes the step in flight and undo async scheduling; so
every per-step input goes through pinned memory, whose copy is queued like a kernel.
"""

import numpy as np
import torch


def to_device(array: np.ndarray | list, dtype: np.dtype | type, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(array, dtype=dtype))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
