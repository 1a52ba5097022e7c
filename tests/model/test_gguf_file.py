"""GGUFFile reads what gguf's GGUFReader reads (metadata, tensor types, shapes, offsets and bytes), and refuses
files that are not GGUF v2/v3, end early, repeat a key or a tensor name, or give a bad alignment."""

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf_writer import write_gguf
from tiny import make_hf_model, make_tiny_tokenizer

from pagedllm.model.gguf_file import GGUFFile


@pytest.mark.parametrize("model_type,qtype", [("llama", Q.F32), ("llama", Q.F16), ("qwen2", Q.Q8_0),
                                              ("llama", Q.Q4_0), ("llama", Q.BF16)])  # fmt: skip
def test_gguf_file_reads_what_gguf_reader_reads(tmp_path, model_type, qtype):
    path = write_gguf(make_hf_model(model_type), tmp_path / "m.gguf", qtype, tokenizer=make_tiny_tokenizer())
    ours, theirs = GGUFFile(path), GGUFReader(path)
    fields = {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert ours.metadata == fields and "tokenizer.ggml.tokens" in fields
    assert (ours.alignment, ours.data_offset) == (theirs.alignment, theirs.data_offset)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors):
        assert (mine.tensor_type, mine.shape, mine.data_offset) == (
            reference.tensor_type, tuple(reference.shape.tolist()), reference.data_offset)
        assert mine.data.dtype == reference.data.dtype and np.array_equal(mine.data, reference.data), mine.name


@pytest.mark.parametrize("change,message", [
    (lambda data: data[:3000], "ends"),  # inside the header (the tokenizer's tables)
    (lambda data: data[:-100], "past the file's end"),  # inside the last tensor
    (lambda data: data[:4] + (1).to_bytes(4, "little") + data[8:], "v2 or v3"),
    (lambda data: data[:16] + (2**40).to_bytes(8, "little") + data[24:], "ends"),  # 2^40 fields: no long loop
])  # fmt: skip
def test_bad_files_raise(tmp_path, change, message):
    path = write_gguf(make_hf_model("llama"), tmp_path / "m.gguf", Q.F32, tokenizer=make_tiny_tokenizer())
    path.write_bytes(change(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        GGUFFile(path)


def _header(fields: list[tuple[str, int, bytes]]) -> bytes:
    """A GGUF v3 file with these (key, value type, value bytes) fields and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields))
    for key, kind, value in fields:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out


@pytest.mark.parametrize("fields,message", [
    ([("a", 4, struct.pack("<I", 1)), ("a", 4, struct.pack("<I", 2))], "appears twice"),
    ([("general.alignment", 7, b"\x01")], "must be a uint32"),  # a bool
    ([("general.alignment", 4, struct.pack("<I", 48))], "power of two"),
    ([("general.alignment", 4, struct.pack("<I", 0))], "power of two"),
])  # fmt: skip
def test_duplicate_keys_and_bad_alignments_raise(tmp_path, fields, message):
    path = tmp_path / "m.gguf"
    path.write_bytes(_header(fields))
    with pytest.raises(ValueError, match=message):
        GGUFFile(path)


def _two_tensors(first: str, second: str) -> bytes:
    """A GGUF v3 file with two F32 tensors of 4 elements (no metadata), at data offsets 0 and 32."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 2, 0)
    for name, offset in ((first, 0), (second, 32)):
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<IQ", 1, 4) + struct.pack("<IQ", 0, offset)
    out += b"\0" * (-len(out) % 32)
    return out + np.arange(16, dtype=np.float32).tobytes() + b"\0" * 16


def test_a_tensor_name_twice_is_refused(tmp_path):
    """Which of the two would load? llama.cpp refuses such a file too."""
    path = tmp_path / "m.gguf"
    path.write_bytes(_two_tensors("a", "b"))
    assert [t.name for t in GGUFFile(path).tensors] == ["a", "b"]  # the file is otherwise well formed
    path.write_bytes(_two_tensors("a", "a"))
    with pytest.raises(ValueError, match="a tensor name appears twice"):
        GGUFFile(path)


def test_a_tensor_gguf_cannot_dequantize_is_one_model_load_error(tmp_path, monkeypatch):
    """gguf's dequantize raises ValueError (data not a whole number of blocks) as well as NotImplementedError
    (a type it lacks): either is one ModelLoadError that names the tensor."""
    import gguf.quants

    from pagedllm.errors import ModelLoadError
    from pagedllm.model.gguf_loader import dequantize

    path = tmp_path / "m.gguf"
    path.write_bytes(_two_tensors("a", "b"))
    tensor = GGUFFile(path).tensors[0]
    assert dequantize(tensor, path).tolist() == [0.0, 1.0, 2.0, 3.0]

    def not_whole_blocks(data, qtype):
        raise ValueError("Quantized data is not a multiple of the block size")

    monkeypatch.setattr(gguf.quants, "dequantize", not_whole_blocks)
    with pytest.raises(ModelLoadError, match=r"cannot dequantize a \(F32\)"):
        dequantize(tensor, path)
