"""Prints the history rows of an offline W&B run (`run-*.wandb`) as JSON lines, read with the
`wandb` package's own record type. The file is LevelDB's log format: a 7-byte header (":W&B",
0xBEE1 little-endian, a version byte), then 32 KiB blocks of records, each with a 7-byte header
(CRC-32, length, type: 1 whole, 2 first, 3 middle, 4 last)."""

import json
import struct
import sys

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768


def payloads(data):
    if data[:4] != b":W&B" or struct.unpack("<H", data[4:6])[0] != 0xBEE1:
        sys.exit("not a .wandb file")
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


with open(sys.argv[1], "rb") as f:
    data = f.read()
for raw in payloads(data):
    r = pb.Record()
    r.ParseFromString(raw)
    if r.WhichOneof("record_type") == "history":
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        print(json.dumps(row))
