"""GGUFFile reads what gguf's GGUFReader reads (metadata, tensor types, shapes, offsets and bytes), and refuses
files that are not GGUF v2/v3, end early, repeat a key or give a bad alignment."""

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
