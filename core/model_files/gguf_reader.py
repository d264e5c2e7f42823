"""Opening a GGUF file with the `gguf` package's reader, and its metadata as plain Python values.

A file that is not a GGUF, or one cut short, is a ModelUnavailable naming the file, never a
traceback out of numpy: the reader maps the file and fails wherever its offsets run past the end.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.constants import GGML_QUANT_SIZES

from core.model_files.errors import ModelUnavailable

GGUF_MAGIC = b"GGUF"


def open_gguf(path: Path) -> GGUFReader:
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelUnavailable(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises whatever numpy or struct raised on a damaged file
        raise ModelUnavailable(f"{path} is a damaged or truncated GGUF file: {exc}") from exc
    for tensor in reader.tensors:
        check_tensor_size(path, tensor)
    return reader


def check_tensor_size(path: Path, tensor: ReaderTensor) -> None:
    """A truncated file can leave the last tensors shorter than their shape says: refuse it here."""
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.tensor_type)]
    expected = int(np.prod(tensor.shape)) // block_size * type_size
    if tensor.data.nbytes != expected:
        raise ModelUnavailable(
            f"{path} is truncated or damaged: tensor {tensor.name} has {tensor.data.nbytes} bytes, "
            f"its shape and type need {expected}"
        )


def read_metadata(reader: GGUFReader) -> dict[str, object]:
    """Every key-value field: strings, numbers, bools, and lists of them."""
    metadata: dict[str, object] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the header's own counts, not metadata
        value = field.contents()
        metadata[name] = value.item() if isinstance(value, np.generic) else value
    return metadata
