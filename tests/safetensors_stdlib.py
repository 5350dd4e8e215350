"""The safetensors format (core/io/safetensors.hpp) read and written with the standard library and
torch alone (F32, BF16, F16, I32, I64): what the PyTorch-side scripts (tests/safetensors_torch.py,
chapters/model_parallel/torchvision_resnet50.py) use where the safetensors package is missing (Debian
12 does not package it). The writer follows d2l's rules: the tensors by dtype in the reference's order,
then by name; the header padded with spaces to a multiple of 8 bytes.
"""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "I32": torch.int32, "I64": torch.int64, "BF16": torch.bfloat16, "F16": torch.float16}
# The reference writer's order of dtypes: later in its enum first (I64, F32, I32, BF16, F16).
RANK = {"I64": 0, "F32": 1, "I32": 2, "BF16": 3, "F16": 4}
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def load_file(path):
    """{name: tensor} of the file at `path` (its __metadata__ left out)."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        raw = bytearray(b[8 + n + begin:8 + n + end])
        t = torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def save_file(tensors, path):
    """Writes {name: tensor} (float32, bfloat16, float16, int32 or int64) to `path`."""
    order = sorted(tensors.items(), key=lambda kv: (RANK[NAMES[kv[1].dtype]], kv[0]))
    header, chunks, offset = {}, [], 0
    for name, t in order:
        t = t.detach().contiguous().cpu()
        # NumPy has no bfloat16: 16-bit values travel as their bits.
        data = (t.view(torch.int16) if t.element_size() == 2 else t).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
