#!/usr/bin/env python3
"""Writes a random control-vector GGUF (llama.cpp's format: one F32 tensor `direction.N` of
n_embd elements per layer N) for checking `--control-vector` on a GPU machine without the gguf
package. Usage: random-control-vector.py N_EMBD LAYERS(comma-separated) STDDEV OUT [SEED]."""
import random
import struct
import sys

ALIGN = 32


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main():
    n_embd, layers = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")]
    stddev, out = float(sys.argv[3]), sys.argv[4]
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    # Header: magic, version 3, tensor count, one metadata pair (type 8 = string).
    head = b"GGUF" + struct.pack("<IQQ", 3, len(layers), 1)
    head += gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("controlvector")
    size = (n_embd * 4 + ALIGN - 1) // ALIGN * ALIGN
    for i, layer in enumerate(layers):
        # name, 1 dimension of n_embd, type 0 (F32), offset into the data section.
        head += gguf_string(f"direction.{layer}") + struct.pack("<IQIQ", 1, n_embd, 0, i * size)
    head += b"\0" * (-len(head) % ALIGN)
    data = b""
    for _ in layers:
        row = struct.pack(f"<{n_embd}f", *(rng.gauss(0.0, stddev) for _ in range(n_embd)))
        data += row + b"\0" * (size - len(row))
    with open(out, "wb") as f:
        f.write(head + data)


if __name__ == "__main__":
    main()
