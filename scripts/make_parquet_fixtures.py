"""Writes the Parquet fixtures of `tests/fixtures/data/` with pyarrow (what `datasets` and the
Hugging Face Hub write Parquet with), beside the same rows as JSONL.

    python3 -m venv /tmp/pa && /tmp/pa/bin/pip install pyarrow==26.0.1
    /tmp/pa/bin/python scripts/make_parquet_fixtures.py

- `chat.jsonl`: 60 conversational rows (`messages`, a number `solution`, a boolean `carry`);
- `chat-snappy.parquet`, `chat-zstd.parquet`: the same rows, snappy (pyarrow's default) and
  zstd (polars' default) compressed, in two row groups;
- `hub/data/train-0000{0,1}-of-00002.parquet` and `hub/data/test-00000-of-00001.parquet`: the
  Hub's layout of a dataset's splits (the first 40 rows in two shards, then the rest as `test`);
- `bad.parquet`: row 3 (1-based) has a null `solution`;
- `scored.jsonl`, `scored.parquet`: an offline dataset of scored responses (`prompt`,
  `responses` as a list of `{response, reward, truncated}` structs, one reward null);
- `pairs.jsonl`, `pairs.parquet`: an offline preference dataset (`prompt`, `chosen`, `rejected`,
  `chosen_reward`).
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "data")


def rows():
    out = []
    for i in range(60):
        a, b = 10 + i, 23 + 2 * i
        out.append({
            "messages": [
                {"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": f"What is {a} + {b}?"},
            ],
            "solution": a + b,
            "carry": (a % 10) + (b % 10) >= 10,
        })
    return out


def main():
    os.makedirs(os.path.join(OUT, "hub", "data"), exist_ok=True)
    rs = rows()
    with open(os.path.join(OUT, "chat.jsonl"), "w") as f:
        for r in rs:
            f.write(json.dumps(r) + "\n")
    table = pa.Table.from_pylist(rs)
    for codec in ("snappy", "zstd"):
        pq.write_table(table, os.path.join(OUT, f"chat-{codec}.parquet"), compression=codec,
                       row_group_size=25)
    hub = os.path.join(OUT, "hub", "data")
    pq.write_table(pa.Table.from_pylist(rs[:20]), os.path.join(hub, "train-00000-of-00002.parquet"))
    pq.write_table(pa.Table.from_pylist(rs[20:40]),
                   os.path.join(hub, "train-00001-of-00002.parquet"))
    pq.write_table(pa.Table.from_pylist(rs[40:]), os.path.join(hub, "test-00000-of-00001.parquet"))
    bad = [dict(r) for r in rs[:5]]
    bad[2]["solution"] = None
    pq.write_table(pa.Table.from_pylist(bad), os.path.join(OUT, "bad.parquet"))
    offline("scored", [
        {"prompt": f"{a}+{a + 1}=", "responses": [
            {"response": str(2 * a + 1), "reward": 1.0, "truncated": False},
            {"response": str(2 * a), "reward": None if a == 12 else 0.0, "truncated": False},
            {"response": "99999", "reward": 0.0, "truncated": True},
        ]} for a in range(10, 14)
    ])
    offline("pairs", [
        {"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": str(2 * a + 1),
         "chosen_reward": 0.5 + a / 100} for a in range(20, 25)
    ])


def offline(name, rs):
    with open(os.path.join(OUT, f"{name}.jsonl"), "w") as f:
        for r in rs:
            f.write(json.dumps(r) + "\n")
    pq.write_table(pa.Table.from_pylist(rs), os.path.join(OUT, f"{name}.parquet"))


if __name__ == "__main__":
    main()
