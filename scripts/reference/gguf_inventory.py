#!/usr/bin/env python3
"""Prints a GGUF file's inventory as JSON, read by the `gguf` package.

Used by model/gguf/gguf_file_test.cc to check Baton's reader against an
independent implementation: every metadata key with its type and value
(arrays as element type, length and first elements) and every tensor with its
type, shape (outermost first) and absolute data offset.

    python scripts/reference/gguf_inventory.py MODEL.gguf > inventory.json
"""
import json
import sys

from gguf import GGUFReader, GGUFValueType


def scalar(field, index):
    part = field.parts[index]
    if field.types[-1] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    value = part.tolist()[0]
    return bool(value) if field.types[-1] == GGUFValueType.BOOL else value


def main():
    reader = GGUFReader(sys.argv[1])
    metadata = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        entry = {"key": key, "type": int(field.types[0])}
        if field.types[0] == GGUFValueType.ARRAY:
            entry["element_type"] = int(field.types[1]) if len(field.types) > 1 else None
            entry["length"] = len(field.data)
            entry["head"] = [scalar(field, i) for i in field.data[:8]] if len(field.types) == 2 else []
        else:
            entry["value"] = scalar(field, field.data[0])
        metadata.append(entry)
    tensors = [{
        "name": t.name,
        "type": int(t.tensor_type),
        "shape": [int(d) for d in reversed(t.shape.tolist())],
        "offset": int(t.data_offset),
        "nbytes": int(t.n_bytes),
    } for t in reader.tensors]
    json.dump({"metadata": metadata, "tensors": tensors}, sys.stdout)


if __name__ == "__main__":
    main()
