"""Parity corpus for the Rust math verifier (`rredcot::math`) against PyPI math-verify.

Generates a deterministic (seeded) corpus of (gold, response) pairs covering integers, decimals,
fractions, LaTeX fractions, roots, pi, percentages, expressions, intervals, tuples, sets, units and
the usual answer forms (\\boxed, ####, "the answer is", "final answer:"), with hard negatives
(close-but-wrong numbers, swapped tuples, open vs closed intervals, wrong sign, ...), and labels
every pair with math-verify's judgement:

    gold  -> math_verify.parse("\\boxed{" + gold + "}")
    resp  -> math_verify.parse(response)           (default extraction config)
    label -> math_verify.verify(gold_parsed, resp_parsed)

Writes one JSON object per line to the path given as the first argument (or stdout):
    {"id", "category", "gold", "response", "math_verify": bool}

Exit status 3 (with a one-line reason on stderr) when math-verify is not importable, so the Rust
test can print a clear SKIP.
"""

import json
import random
import sys

SEED = 20261123
PER_CATEGORY = 200

try:
    import logging

    logging.disable(logging.CRITICAL)
    from math_verify import parse, verify  # noqa: E402
    import math_verify  # noqa: E402
except Exception as e:  # pragma: no cover - environment dependent
    print(f"math-verify not importable: {e!r}", file=sys.stderr)
    sys.exit(3)


def wrap(rng: random.Random, ans: str, plain: str | None = None) -> str:
    """Embed an answer in a model-like response, with distractor numbers before it."""
    lead = rng.choice(
        [
            "",
            "Let me compute step by step. First 3 + 4 = 7, then we double it. ",
            "We have 12 apples and 5 bags. ",
            "Step 1: set x = 2. Step 2: simplify. ",
            "After checking cases 1, 2 and 3, ",
        ]
    )
    p = plain if plain is not None else ans
    form = rng.choice(["boxed", "boxed", "answer_is", "final", "hash", "dollar", "fbox"])
    if form == "boxed":
        return f"{lead}So the result is $\\boxed{{{ans}}}$."
    if form == "fbox":
        return f"{lead}Therefore \\fbox{{{ans}}}"
    if form == "answer_is":
        return f"{lead}The answer is ${ans}$."
    if form == "final":
        return f"{lead}Final answer: ${ans}$"
    if form == "hash":
        return f"{lead}\n#### {p}"
    return f"{lead}Thus we get ${ans}$"


def frac(a: int, b: int, cmd: str = "\\frac") -> str:
    s = "-" if a * b < 0 else ""
    return f"{s}{cmd}{{{abs(a)}}}{{{abs(b)}}}"


def fmt_thousands(n: int) -> str:
    return f"{n:,}"


def gen_integers(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(10000, 5_000_000)])
        if rng.random() < 0.2:
            n = -n
        g = str(n)
        out += [
            (g, wrap(rng, str(n))),
            (g, f"The answer is {fmt_thousands(n)}."),
            (g, f"Adding everything up gives {n} in total.\n#### {n}"),
            (g, f"So she has {n} apples left."),
            (g, wrap(rng, str(n + rng.choice([1, -1, 10])))),
            (g, wrap(rng, str(-n if n != 0 else 1))),
            (g, f"The answer is {n + rng.randint(1, 3)}."),
            (g, f"#### {n * 10 if n else 7}"),
        ]
    return out


def gen_decimals(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        cents = rng.randint(1, 99999)
        d = cents / 100
        g = f"{d:.2f}"
        out += [
            (g, wrap(rng, g)),
            (g, wrap(rng, f"{d:.2f}0")),
            (g, f"The answer is {d:.2f}."),
            (g, wrap(rng, f"{d + 0.0000001:.7f}")),  # within 6-decimal rounding
            (g, wrap(rng, f"{d + 0.01:.2f}")),  # close but wrong
            (g, wrap(rng, f"{d + 0.0001:.4f}")),  # close but wrong at 4 d.p.
            (g, wrap(rng, frac(cents, 100))),
            (g, wrap(rng, f"-{d:.2f}")),
        ]
    return out


def gen_fractions(rng):
    out = []
    for _ in range(PER_CATEGORY // 10):
        b = rng.randint(2, 30)
        a = rng.randint(1, 60)
        while a % b == 0:
            a = rng.randint(1, 60)
        if rng.random() < 0.2:
            a = -a
        g = frac(a, b)
        k = rng.randint(2, 5)
        val = a / b
        out += [
            (g, wrap(rng, frac(a, b))),
            (g, wrap(rng, frac(a, b, "\\dfrac"))),
            (g, wrap(rng, frac(a * k, b * k))),
            (g, f"The answer is {a}/{b}."),
            (g, wrap(rng, f"{val:.6f}")),
            (g, wrap(rng, f"{val:.3f}")),  # rounded too early: wrong
            (g, wrap(rng, frac(b, a))),  # inverted
            (g, wrap(rng, frac(a + 1, b))),
            (g, wrap(rng, frac(-a, b))),
            (g, wrap(rng, frac(a, b, "\\tfrac"))),
        ]
    return out


def gen_mixed(rng):
    out = []
    for _ in range(PER_CATEGORY // 5):
        w = rng.randint(1, 9)
        b = rng.randint(2, 9)
        a = rng.randint(1, b - 1)
        g = frac(w * b + a, b)
        out += [
            (g, f"So the answer is $\\boxed{{{w}\\frac{{{a}}}{{{b}}}}}$."),
            (g, wrap(rng, frac(w * b + a, b))),
            (g, f"$\\boxed{{{w}\\frac{{{a}}}{{{b + 1}}}}}$"),
            (g, wrap(rng, f"{(w * b + a) / b:.6f}")),
            (g, wrap(rng, frac(w * b - a, b))),
        ]
    return out


def gen_sqrt(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        k = rng.randint(2, 9)
        r = rng.choice([2, 3, 5, 6, 7, 10, 11])
        g = f"{k}\\sqrt{{{r}}}"
        v = k * r**0.5
        out += [
            (g, wrap(rng, f"{k}\\sqrt{{{r}}}")),
            (g, wrap(rng, f"\\sqrt{{{k * k * r}}}")),
            (g, wrap(rng, f"{k}\\sqrt{r}")),
            (g, wrap(rng, f"{v:.6f}")),
            (g, wrap(rng, f"{v:.2f}")),
            (g, wrap(rng, f"{k + 1}\\sqrt{{{r}}}")),
            (g, wrap(rng, f"\\sqrt{{{k * r}}}")),
            (g, wrap(rng, f"\\frac{{\\sqrt{{{r}}}}}{{{k}}}")),
        ]
    return out


def gen_pi(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        k = rng.randint(2, 12)
        b = rng.choice([1, 2, 3, 4, 6])
        g = f"{k}\\pi" if b == 1 else f"\\frac{{{k}\\pi}}{{{b}}}"
        v = k * 3.141592653589793 / b
        out += [
            (g, wrap(rng, g)),
            (g, wrap(rng, f"{k}\\pi" if b == 1 else f"\\frac{{{k}}}{{{b}}}\\pi")),
            (g, wrap(rng, f"\\pi \\cdot {k}" if b == 1 else f"{k}\\pi/{b}")),
            (g, wrap(rng, f"{v:.6f}")),
            (g, wrap(rng, f"{v:.2f}")),
            (g, wrap(rng, f"{k + 1}\\pi")),
            (g, wrap(rng, f"{k}\\pi^2")),
            (g, wrap(rng, f"{k}")),
        ]
    return out


def gen_percent(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        p = rng.randint(1, 99)
        g = f"{p}\\%"
        out += [
            (g, wrap(rng, f"{p}\\%")),
            (g, f"The answer is {p}%."),
            (g, f"So the discount is {p} percent."),
            (g, wrap(rng, f"{p / 100}")),
            (g, wrap(rng, f"{p}")),
            (g, wrap(rng, f"{p + 1}\\%")),
            (g, f"The answer is {p / 1000}."),
            (g, wrap(rng, f"{p}.5\\%")),
        ]
    return out


def gen_expressions(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        b = rng.randint(2, 5)
        e = rng.randint(2, 10)
        a = rng.randint(2, 9)
        c = rng.randint(2, 9)
        d = rng.randint(1, 9)
        g = rng.choice([f"{b}^{{{e}}}", f"{a}+{c}\\cdot {d}", f"({a}+{c})\\times {d}"])
        val = eval(g.replace("^{", "**(").replace("}", ")").replace("\\cdot", "*").replace("\\times", "*"))
        wrong = val + rng.choice([1, -1, 2])
        out += [
            (g, wrap(rng, str(val))),
            (g, wrap(rng, g)),
            (g, f"The answer is {g.replace('^{', '^').replace('}', '').replace(chr(92) + 'cdot', '*').replace(chr(92) + 'times', '*')}."),
            (g, f"The answer is {val}."),
            (g, wrap(rng, str(wrong))),
            (g, wrap(rng, f"{a}\\cdot{c}+{d}")),
            (g, wrap(rng, f"\\frac{{{2 * val}}}{{2}}")),
            (g, wrap(rng, f"-{val}")),
        ]
    return out


def interval(lo, hi, lc, rc):
    return f"{'[' if lc else '('}{lo}, {hi}{']' if rc else ')'}"


def gen_intervals(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        lo = rng.randint(-9, 5)
        hi = lo + rng.randint(1, 9)
        lc, rc = rng.random() < 0.5, rng.random() < 0.5
        if not lc and not rc:
            rc = True  # (a, b) collides with the tuple notation; tuples get their own category
        los = str(lo)
        his = str(hi)
        if rng.random() < 0.2:
            los, lc = "-\\infty", False
        g = interval(los, his, lc, rc)
        out += [
            (g, wrap(rng, g)),
            (g, wrap(rng, g.replace(" ", ""))),
            (g, wrap(rng, f"\\left{g[0]}{los},{his}\\right{g[-1]}")),
            (g, wrap(rng, interval(los, his, not lc, rc))),
            (g, wrap(rng, interval(los, his, lc, not rc))),
            (g, wrap(rng, interval(los, hi + 1, lc, rc))),
            (g, wrap(rng, interval(los, his, not lc, not rc))),
            (g, wrap(rng, interval(lo - 1, his, lc, rc))),
        ]
    return out


def gen_tuples(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.choice([2, 3])
        xs = [rng.randint(-9, 9) for _ in range(n)]
        while len(set(xs)) < n:
            xs = [rng.randint(-9, 9) for _ in range(n)]
        if n == 2 and xs[0] > xs[1]:
            xs.reverse()  # (a, b) with a > b is not an interval; keep the tuple reading unambiguous
        g = "(" + ", ".join(map(str, xs)) + ")"
        sw = list(reversed(xs))
        bumped = xs[:-1] + [xs[-1] + 1]
        neg = [-xs[0]] + xs[1:]
        out += [
            (g, wrap(rng, g)),
            (g, wrap(rng, g.replace(" ", ""))),
            (g, wrap(rng, "\\left(" + ", ".join(map(str, xs)) + "\\right)")),
            (g, wrap(rng, "(" + ", ".join(map(str, sw)) + ")")),
            (g, wrap(rng, "(" + ", ".join(map(str, bumped)) + ")")),
            (g, wrap(rng, "(" + ", ".join(map(str, neg)) + ")")),
            (g, wrap(rng, "[" + ", ".join(map(str, xs)) + "]")),
            (g, wrap(rng, "(" + ", ".join(map(str, xs[:-1])) + ")" if n == 3 else "(" + str(xs[0]) + ")")),
        ]
    return out


def gen_sets(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.choice([2, 3, 4])
        xs = rng.sample(range(-9, 10), n)
        g = "\\{" + ", ".join(map(str, sorted(xs))) + "\\}"
        sh = xs[:]
        rng.shuffle(sh)
        out += [
            (g, wrap(rng, "\\{" + ", ".join(map(str, sh)) + "\\}")),
            (g, wrap(rng, "\\{" + ",".join(map(str, sorted(xs))) + "\\}")),
            (g, wrap(rng, ", ".join(map(str, sh)))),
            (g, wrap(rng, "\\{" + ", ".join(map(str, sh[:-1])) + "\\}")),
            (g, wrap(rng, "\\{" + ", ".join(map(str, sh + [max(xs) + 1])) + "\\}")),
            (g, wrap(rng, "\\{" + ", ".join(map(str, [-sh[0]] + sh[1:])) + "\\}")),
            (g, wrap(rng, "\\left\\{" + ", ".join(map(str, sh)) + "\\right\\}")),
            (g, wrap(rng, "\\{" + ", ".join(map(str, [x + 1 for x in sh])) + "\\}")),
        ]
    return out


def gen_units(rng):
    out = []
    units = ["cm", "meters", "km", "kg", "hours", "minutes", "inches", "feet", "degrees", "mph"]
    for _ in range(PER_CATEGORY // 8):
        n = rng.randint(1, 500)
        u = rng.choice(units)
        g = rng.choice([str(n), f"{n}\\text{{ {u}}}", f"{n}^\\circ", f"\\${n}"])
        out += [
            (g, f"The length is $\\boxed{{{n} \\text{{ {u}}}}}$."),
            (g, f"The answer is {n} {u}."),
            (g, f"So the angle is $\\boxed{{{n}^\\circ}}$."),
            (g, f"She pays $\\boxed{{\\${n}}}$ in total."),
            (g, f"So it costs ${n}.\n#### {n}"),
            (g, f"The length is $\\boxed{{{n + 1} \\text{{ {u}}}}}$."),
            (g, f"So the angle is $\\boxed{{{n + 10}^\\circ}}$."),
            (g, f"The answer is {n * 2} {u}."),
        ]
    return out


def gen_forms(rng):
    """Answer-form extraction: the right number must win over distractors."""
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.randint(2, 999)
        m = n + rng.randint(1, 50)
        g = str(n)
        out += [
            (g, f"We try {m} first, but that fails. The answer is {n}."),
            (g, f"We try {m} first.\n#### {n}"),
            (g, f"Final answer: {n}"),
            (g, f"Initially we thought $\\boxed{{{m}}}$ but correcting, $\\boxed{{{n}}}$."),
            (g, f"The final answer is {n}. I hope it is correct."),
            (g, f"I computed {n} earlier, but the answer is {m}."),
            (g, f"Final answer: {m}"),
            (g, f"The answer is $\\boxed{{\\boxed{{{n}}}}}$"),
        ]
    return out


def gen_signs(rng):
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.randint(1, 99)
        b = rng.randint(2, 9)
        g = rng.choice([f"-{n}", frac(-n, b) if n % b else f"-{n}", f"-\\sqrt{{{b}}}" if b not in (4, 9) else f"-{n}"])
        pos = g[1:]
        out += [
            (g, wrap(rng, g)),
            (g, wrap(rng, pos)),
            (g, wrap(rng, "-(" + pos + ")")),
            (g, f"The answer is {g}."),
            (g, wrap(rng, "+" + pos)),
            (g, wrap(rng, "--" + pos)),
            (g, wrap(rng, f"-{n + 1}")),
            (g, wrap(rng, "\\left(-" + pos + "\\right)")),
        ]
    return out


def gen_misc_forms(rng):
    """Markdown emphasis, assignments, trailing units/currency words, padded literals."""
    out = []
    for _ in range(PER_CATEGORY // 8):
        n = rng.randint(1, 999)
        g = str(n)
        out += [
            (g, f"**Answer:** {n}"),
            (g, f"The answer is **{n}**."),
            (g, f"$\\boxed{{x = {n}}}$"),
            (g, f"Solving, we get x = {n}."),
            (g, f"$\\boxed{{{n}.0}}$"),
            (g, f"Answer: ${n}$ dollars"),
            (g, f"The answer is **{n + 1}**."),
            (g, f"$\\boxed{{x = {-n}}}$"),
        ]
    return out


def gen_equation_forms(rng):
    """The value after the last '=' of a worked line is the answer."""
    out = []
    for _ in range(PER_CATEGORY // 8):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        n = a + b
        g = str(n)
        out += [
            (g, f"The answer is {a} + {b} = {n}."),
            (g, f"Answer: {a} + {b} = {n}"),
            (g, f"So the answer is x = {n}"),
            (g, f"The answer is $x = {n}$."),
            (g, f"The final answer is ${n}$"),
            (g, f"The answer is {a} + {b} = {n + 1}."),
            (g, f"Answer: {a} * {b} = {a * b}"),
            (g, f"So the answer is x = {a - b}"),
        ]
    return out


GENERATORS = [
    ("integer", gen_integers),
    ("decimal", gen_decimals),
    ("fraction", gen_fractions),
    ("mixed_number", gen_mixed),
    ("sqrt", gen_sqrt),
    ("pi", gen_pi),
    ("percent", gen_percent),
    ("expression", gen_expressions),
    ("interval", gen_intervals),
    ("tuple", gen_tuples),
    ("set", gen_sets),
    ("units", gen_units),
    ("answer_form", gen_forms),
    ("sign", gen_signs),
    ("misc_form", gen_misc_forms),
    ("equation_form", gen_equation_forms),
]


def main() -> None:
    rng = random.Random(SEED)
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    i = 0
    for name, gen in GENERATORS:
        for gold, response in gen(rng):
            g = parse("\\boxed{" + gold + "}")
            p = parse(response)
            label = bool(verify(g, p))
            row = {"id": i, "category": name, "gold": gold, "response": response, "math_verify": label}
            out.write(json.dumps(row) + "\n")
            i += 1
    out.flush()
    print(f"math-verify {getattr(math_verify, '__version__', '?')}: {i} pairs", file=sys.stderr)


if __name__ == "__main__":
    main()
