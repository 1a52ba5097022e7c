"""A GGUF file's metadata and tensors, read for loading a model.

gguf's GGUFReader makes numpy views of every part of every key/value, one per string of the tokenizer's tables:
1.9 s for the default model's 49k-token vocabulary and merges, a third of its start. This reads the same
(GGUF v2 and v3, little-endian) with struct, and the tensors as views of one memory map, in the form
gguf.quants.dequantize takes (quantized types as bytes, [..., bytes per row]).
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}  # fmt: skip
_UINT32, _STRING, _ARRAY = 4, 8, 9
# element types stored as themselves; every other type is blocks of bytes
_PLAIN = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
          GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64}  # fmt: skip


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: innermost dimension first
    data_offset: int  # from the start of the file
    data: np.ndarray  # a view of the file


class GGUFFile:
    """metadata: key -> value (arrays as lists); tensors in the file's order. Raises ValueError on a file that is
    not GGUF v2/v3, truncated, or malformed."""

    def __init__(self, path: Path) -> None:
        self._data = np.memmap(path, dtype=np.uint8, mode="r")
        self._pos = 0
        magic, version = self._unpack("<4sI")
        if magic != MAGIC or version not in (2, 3):
            raise ValueError(f"not a GGUF v2 or v3 file (magic {magic!r}, version {version})")
        num_tensors, num_fields = self._unpack("<QQ")
        self.metadata: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            (kind,) = self._unpack("<I")
            if key in self.metadata:
                raise ValueError(f"the key {key!r} appears twice")
            if key == "general.alignment" and kind != _UINT32:
                raise ValueError(f"general.alignment must be a uint32, got value type {kind}")
            self.metadata[key] = self._value(kind)
        infos = [self._tensor_info() for _ in range(num_tensors)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.data_offset = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(*info) for info in infos]
        if len({t.name for t in self.tensors}) < len(self.tensors):
            raise ValueError("a tensor name appears twice")

    def _unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._data):
            raise ValueError(f"the file ends at byte {len(self._data)}, inside its header")
        values = struct.unpack_from(fmt, self._data, self._pos)
        self._pos += size
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        if self._pos + length > len(self._data):
            raise ValueError(f"the file ends at byte {len(self._data)}, inside its header")
        text = bytes(self._data[self._pos : self._pos + length]).decode("utf-8")
        self._pos += length
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._unpack("<IQ")
            return self._array(item_kind, count)
        if kind not in _SCALARS:
            raise ValueError(f"unknown value type {kind}")
        return self._unpack(_SCALARS[kind])[0]

    def _array(self, kind: int, count: int) -> list:
        smallest = {_STRING: 8, _ARRAY: 12}.get(kind, 1)  # bytes an element takes at least
        if count * smallest > len(self._data) - self._pos:
            raise ValueError(f"the file ends before the {count} elements of an array")
        if kind in _NUMPY:  # one read for the whole array
            size = np.dtype(_NUMPY[kind]).itemsize * count
            if self._pos + size > len(self._data):
                raise ValueError(f"the file ends at byte {len(self._data)}, inside its header")
            values = np.frombuffer(self._data, _NUMPY[kind], count, self._pos).tolist()
            self._pos += size
            return values
        return [self._value(kind) for _ in range(count)]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (num_dims,) = self._unpack("<I")
        shape = self._unpack(f"<{num_dims}Q")
        kind, offset = self._unpack("<IQ")
        return name, shape, kind, offset

    def _tensor(self, name: str, shape: tuple[int, ...], kind: int, offset: int) -> GGUFTensor:
        tensor_type = GGMLQuantizationType(kind)  # ValueError for a type gguf does not know
        rows_first = tuple(reversed(shape))
        block_elements, block_bytes = GGML_QUANT_SIZES[tensor_type]
        num_bytes = int(np.prod(shape, dtype=np.int64)) * block_bytes // block_elements
        start = self.data_offset + offset
        if start + num_bytes > len(self._data):
            raise ValueError(f"tensor {name} ends past the file's end")
        if tensor_type in _PLAIN:
            data = self._data[start : start + num_bytes].view(_PLAIN[tensor_type]).reshape(rows_first)
        else:
            data = self._data[start : start + num_bytes].reshape(quant_shape_to_byte_shape(rows_first, tensor_type))
        return GGUFTensor(name, tensor_type, shape, start, data)
