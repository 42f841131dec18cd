"""Relabel the committed real-model-answer corpus with math-verify (for tests/verifier_parity.rs).

    model_answer_labels.py CORPUS OUT

CORPUS is `data/real-answers/smollm2-math.jsonl` (built by bench/real_answers.py). For every row,
in order, writes {"id", "math_verify_extracted", "math_verify_answer", "math_verify_plain",
"math_verify_boxed"} to OUT ([`labels`], which bench/real_answers.py uses too), so the test can
check the stored labels are math-verify's.
Exit status 3 (one line on stderr) when math-verify is not installed.
"""

import json
import logging
import sys

try:
    logging.disable(logging.CRITICAL)
    from math_verify import parse, verify  # noqa: E402
except Exception as e:  # pragma: no cover - environment dependent
    print(f"math-verify not importable: {e!r}", file=sys.stderr)
    sys.exit(3)


def labels(gold: str, response: str) -> dict:
    """math-verify's reading of one answer: whether it extracts anything, the text it extracted
    (its string fallback, the last element of `parse`), and its verdicts in both gold conventions."""
    pred = parse(response)
    return {
        "math_verify_extracted": bool(pred),
        "math_verify_answer": str(pred[-1]) if pred else "",
        "math_verify_plain": bool(verify(parse(gold), pred)),
        "math_verify_boxed": bool(verify(parse("\\boxed{" + gold + "}"), pred)),
    }


def main() -> None:
    src, dest = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            out.write(json.dumps({"id": r["id"], **labels(r["gold"], r["response"])}) + "\n")


if __name__ == "__main__":
    main()
