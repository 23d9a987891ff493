"""A small, dependency-free (numpy + torch) safetensors reader and writer.

Format (https://github.com/huggingface/safetensors): u64 little-endian N, then N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}}, offsets relative to
the first byte after the header, data C-order little-endian. The writer matches the official writer's
layout: compact JSON with "__metadata__" first, tensors ordered by dtype (descending, as the official
Dtype enum) then name, data packed in that order with no gaps, header padded with spaces to a multiple of 8.
"""

import json
import struct

import numpy as np
import torch

# dtype name -> (numpy little-endian dtype, itemsize, rank in the official Dtype enum used for ordering)
_DTYPES = {
    "BOOL": ("|b1", 1, 0),
    "U8": ("|u1", 1, 1),
    "I8": ("|i1", 1, 2),
    "I16": ("<i2", 2, 5),
    "U16": ("<u2", 2, 6),
    "F16": ("<f2", 2, 7),
    "BF16": ("<u2", 2, 8),
    "I32": ("<i4", 4, 9),
    "U32": ("<u4", 4, 10),
    "F32": ("<f4", 4, 11),
    "F64": ("<f8", 8, 12),
    "I64": ("<i8", 8, 13),
    "U64": ("<u8", 8, 14),
}

_TORCH_TO_ST = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class SafetensorsError(Exception):
    pass


def read_header(path):
    """Returns (header dict without __metadata__, metadata dict or None, header_len, data_start)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw)
        hb = f.read(n)
        if len(hb) != n:
            raise SafetensorsError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(hb.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad JSON header: {e}")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    return header, meta, n, 8 + n


def bf16_bits_to_f32(u16):
    """numpy uint16 array of bfloat16 bit patterns -> float32 array (exact)."""
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def read_safetensors(path, names=None):
    """Reads tensors. Returns (dict name -> torch.Tensor, dict name -> dtype string, metadata).

    F32 -> float32, F64 -> float64, F16 -> float16, BF16 -> float32 (exact widening), integer types -> the
    matching torch integer type (U16/U32/U64 -> int64 via numpy widening; U64 values above 2^63 wrap).
    """
    header, meta, _, start = read_header(path)
    with open(path, "rb") as f:
        data = f.read()
    body = len(data) - start
    # Validate: offsets in range, sizes match, the tensors tile the data buffer without gaps or overlap.
    spans = []
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise SafetensorsError(f"{path}: {name}: unsupported dtype {dt}")
        shape = info.get("shape")
        b, e = info.get("data_offsets", (None, None))
        if not isinstance(shape, list) or b is None or e is None or not (0 <= b <= e <= body):
            raise SafetensorsError(f"{path}: {name}: bad shape/offsets {shape} {b} {e} (data {body} bytes)")
        numel = 1
        for s in shape:
            numel *= s
        if numel * _DTYPES[dt][1] != e - b:
            raise SafetensorsError(f"{path}: {name}: {e - b} bytes for shape {shape} {dt}")
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise SafetensorsError(f"{path}: {name}: data_offsets begin {b}, expected {pos} (gap/overlap)")
        pos = e
    if pos != body:
        raise SafetensorsError(f"{path}: tensors cover {pos} bytes of a {body}-byte data section")

    out, dtypes = {}, {}
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        dt = info["dtype"]
        npdt, isz, _ = _DTYPES[dt]
        b, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype=np.dtype(npdt), count=(e - b) // isz, offset=start + b)
        if dt == "BF16":
            arr = bf16_bits_to_f32(arr)
        elif dt in ("U16", "U32", "U64"):
            arr = arr.astype(np.int64)
        else:
            arr = arr.astype(arr.dtype.newbyteorder("="))  # native copy (also makes it writable)
        t = torch.from_numpy(arr).reshape(info["shape"])
        out[name] = t
        dtypes[name] = dt
    return out, dtypes, meta


def tensor_bytes(t, dtype):
    """Little-endian C-order bytes of torch tensor t stored as safetensors dtype string `dtype`."""
    t = t.detach().cpu().contiguous()
    if dtype == "BF16":
        # torch's float -> bfloat16 conversion rounds to nearest even; convert from f32 (no double rounding
        # when the source is f32; f64 sources are rounded once to f32 first, documented behaviour).
        if t.dtype != torch.bfloat16:
            t = t.to(torch.float32).to(torch.bfloat16)
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    npdt = _DTYPES[dtype][0]
    if dtype == "F16":
        t = t.to(torch.float16)
    elif dtype == "F32":
        t = t.to(torch.float32)
    elif dtype == "F64":
        t = t.to(torch.float64)
    elif dtype == "I32":
        t = t.to(torch.int32)
    elif dtype == "I64":
        t = t.to(torch.int64)
    return t.numpy().astype(npdt).tobytes()


def _order_key(item):
    name, dt = item
    return (-_DTYPES[dt][2], name)


def write_safetensors(path, tensors, dtype=None, metadata=None):
    """Writes {name: torch.Tensor}. dtype: a safetensors dtype string for all tensors, a dict name -> dtype,
    or None (each tensor's own dtype). metadata defaults to {"format": "pt"} (transformers requires it).
    Returns the number of tensor data bytes written (what an index.json's total_size counts)."""
    if metadata is None:
        metadata = {"format": "pt"}
    dts = {}
    for name, t in tensors.items():
        if name == "__metadata__":
            raise SafetensorsError("tensor name __metadata__ is reserved")
        if isinstance(dtype, dict):
            dts[name] = dtype[name]
        elif dtype is not None:
            dts[name] = dtype
        else:
            dts[name] = _TORCH_TO_ST[t.dtype]
    order = sorted(dts.items(), key=_order_key)
    header = {"__metadata__": dict(metadata)} if metadata else {}
    blobs = []
    pos = 0
    for name, dt in order:
        b = tensor_bytes(tensors[name], dt)
        header[name] = {"dtype": dt, "shape": list(tensors[name].shape), "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
        blobs.append(b)
    hb = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("utf-8")
    hb += b" " * ((-len(hb)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    return pos
