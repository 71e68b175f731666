"""Writes the `datasets` fixtures of `tests/fixtures/data/` with `Dataset.save_to_disk` (what a
`datasets` user has on disk after `load_dataset(...).save_to_disk(path)`): the rows of
`chat.jsonl` (scripts/make_parquet_fixtures.py makes them).

    python3 -m venv /tmp/ds && /tmp/ds/bin/pip install datasets==5.2.0
    /tmp/ds/bin/python scripts/make_arrow_fixtures.py

- `saved/`: the 60 rows as one dataset in two Arrow shards (`data-0000{0,1}-of-00002.arrow`,
  `state.json`, `dataset_info.json`);
- `saved-dict/`: a `DatasetDict` (`dataset_dict.json`) whose `train` split is the first 40
  rows and `test` the rest;
- `saved-bad/`: 5 rows, row 3 (1-based) with a null `solution`.
"""

import json
import os
import shutil

from datasets import Dataset, DatasetDict

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "data")


def main():
    with open(os.path.join(OUT, "chat.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for name in ("saved", "saved-dict", "saved-bad"):
        shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)
    Dataset.from_list(rows).save_to_disk(os.path.join(OUT, "saved"), num_shards=2)
    DatasetDict({
        "train": Dataset.from_list(rows[:40]),
        "test": Dataset.from_list(rows[40:]),
    }).save_to_disk(os.path.join(OUT, "saved-dict"))
    bad = [dict(r) for r in rows[:5]]
    bad[2]["solution"] = None
    Dataset.from_list(bad).save_to_disk(os.path.join(OUT, "saved-bad"))


if __name__ == "__main__":
    main()
