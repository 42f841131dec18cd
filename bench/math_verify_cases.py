"""Real-answer pairs from math-verify's own test suite, labelled by math-verify (issue 18 point 2).

    math_verify_cases.py SDIST OUT

SDIST is the source distribution of PyPI math-verify 0.9.0 (`pip download --no-deps --no-binary
:all: math-verify==0.9.0`). Its tests `tests/test_open_thoughts.py` and `tests/test_numina_cases.py`
hold (gold, prediction, expected) cases that its authors took from model outputs on NuminaMath
olympiad/competition problems (the OpenThoughts traces of DeepSeek-R1, and NuminaMath answers):
golds and predictions this project did not write, most of them correct answers. The cases are read
from the test files' `pytest.mark.parametrize` lists with `ast` (nothing is imported or run).

Each case becomes one row of OUT (JSON lines):
    {"id", "source" (test file), "gold" (the test's gold, one outer `$..$`/`$$..$$` taken off when
     the whole gold is one such span), "gold_as_written" (the test's gold with its delimiters),
     "response" (the test's prediction, as written), "expected" (the test authors' label: is the
     prediction correct?), "math_verify_extracted", "math_verify_answer" (what math-verify reads
     in the response), "math_verify_boxed" (verify(parse("\\boxed{" + gold + "}"), parse(response))),
     "math_verify_as_written" (verify(parse(gold_as_written), parse(response)))}
The golds carry their own `$..$` delimiters, so the second convention is the gold as written, not
the bare gold of the other corpora (math-verify reads no LaTeX outside delimiters: bare, it
accepts 16 of the 56 correct predictions).
"""

import ast
import json
import os
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from model_answer_labels import labels  # noqa: E402

FILES = ("tests/test_open_thoughts.py", "tests/test_numina_cases.py")


def cases(source: str):
    """(gold, pred, expected) tuples of the first `parametrize` list in a test module."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "parametrize"
            and len(node.args) >= 2
        ):
            for elt in ast.literal_eval(node.args[1]):
                yield elt
            return


def strip_outer(gold: str) -> str:
    """`$$x$$` or `$x$` -> `x` when the whole gold is that one span."""
    g = gold.strip()
    for d in ("$$", "$"):
        if g.startswith(d) and g.endswith(d) and len(g) > 2 * len(d):
            inner = g[len(d) : -len(d)]
            if "$" not in inner:
                return inner.strip()
    return g


def main() -> None:
    sdist, dest = sys.argv[1], sys.argv[2]
    rows = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if rel not in FILES:
                continue
            text = tar.extractfile(member).read().decode("utf-8")
            for k, (gold, pred, expected) in enumerate(cases(text)):
                g = strip_outer(gold)
                boxed = labels(g, pred)
                rows.append(
                    {
                        "id": f"{os.path.basename(rel)[:-3]}-{k:03d}",
                        "source": f"math-verify 0.9.0 {rel}",
                        "gold": g,
                        "gold_as_written": gold,
                        "response": pred,
                        "expected": bool(expected),
                        "math_verify_extracted": boxed["math_verify_extracted"],
                        "math_verify_answer": boxed["math_verify_answer"],
                        "math_verify_boxed": boxed["math_verify_boxed"],
                        "math_verify_as_written": labels(gold, pred)["math_verify_plain"],
                    }
                )
    rows.sort(key=lambda r: r["id"])
    with open(dest, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} cases -> {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
