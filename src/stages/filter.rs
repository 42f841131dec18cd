//! `filter` / `filter_tokens`: the open-rr rules (paper Table 2 data) over a prompts artifact.
//!
//! A row is kept when it (in this order; a row is counted under the first rule it fails):
//! 1. has a reference solution (`removed_no_solution`),
//! 2. has a reference answer (`removed_no_answer`),
//! 3. whose answer parses as a number (`removed_unparseable_answer`),
//! 4. equal to the answer at the end of the solution (`removed_answer_mismatch`),
//! 5. with a solution length in `[min_tokens, max_tokens]` (`removed_solution_length`): tokens of
//!    the `tokenizer` input for `filter_tokens`, whitespace-separated words for `filter` (the
//!    run record's `length_unit` metric says which),
//! 6. and whose normalized prompt was not seen in an earlier row (`removed_duplicate`).
//!
//! Answers are compared as exact rationals by [`parse_answer`], a small numeric normalizer
//! (integers, thousands separators, decimals, fractions, `\frac`, `\boxed`, `$`, `%`). It is the one
//! place to swap in the full verifier of `src/math/` later; non-numeric answers are unparseable
//! here. An empty result is an error.

use std::collections::HashSet;

use anyhow::{anyhow, bail};

use super::prompt_text::normalized_hash;
use crate::artifact::rows::PromptRow;
use crate::artifact::{read_rows, write_rows, Schema};
use crate::engine::StageContext;

/// An exact rational number `num / den` in lowest terms, `den > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    pub num: i128,
    pub den: i128,
}

impl Rational {
    fn new(num: i128, den: i128) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()).max(1) as i128;
        let s = if den < 0 { -1 } else { 1 };
        Some(Rational {
            num: s * num / g,
            den: s * den / g,
        })
    }
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Content of the last `\boxed{…}` (balanced braces) in `s`.
fn last_boxed(s: &str) -> Option<&str> {
    let start = s.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1;
    for (i, c) in s[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&s[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `12`, `-3`, `1,234`, `0.25`: a plain decimal number.
fn parse_decimal(s: &str) -> Option<Rational> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    // Thousands separators only in groups of three.
    let groups: Vec<&str> = int.split(',').collect();
    if groups.len() > 1
        && (groups[0].is_empty() || groups[0].len() > 3 || groups[1..].iter().any(|g| g.len() != 3))
    {
        return None;
    }
    let int: String = groups.concat();
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
        || frac.len() > 18
        || int.len() > 30
    {
        return None;
    }
    let int_v: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let scale = 10i128.pow(frac.len() as u32);
    let frac_v: i128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let num = int_v.checked_mul(scale)?.checked_add(frac_v)?;
    Rational::new(if neg { -num } else { num }, scale)
}

/// Parse a final answer as an exact number: `42`, `-7`, `1,000`, `3.50`, `3/4`, `\frac{3}{4}`,
/// `\dfrac34`-free forms, `$18`, `\$18`, `25%` (as 25), `\boxed{…}`, `$…$`, a trailing period.
/// `None` when it is not a number (symbolic answers are left to the full verifier).
pub fn parse_answer(s: &str) -> Option<Rational> {
    let mut t = s.trim();
    if let Some(b) = last_boxed(t) {
        t = b.trim();
    }
    loop {
        let before = t;
        t = t.trim().trim_end_matches('.').trim();
        if let Some(inner) = t.strip_prefix('$').and_then(|x| x.strip_suffix('$')) {
            t = inner;
        }
        if let Some(inner) = t.strip_prefix("\\(").and_then(|x| x.strip_suffix("\\)")) {
            t = inner;
        }
        t = t
            .strip_prefix("\\$")
            .or_else(|| t.strip_prefix('$'))
            .unwrap_or(t);
        t = t
            .strip_suffix("\\%")
            .or_else(|| t.strip_suffix('%'))
            .unwrap_or(t);
        if t == before {
            break;
        }
    }
    let t: String = t
        .replace('\u{2212}', "-")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    for cmd in ["\\frac{", "\\dfrac{", "\\tfrac{"] {
        let (neg, rest) = match t.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, t.as_str()),
        };
        if let Some(rest) = rest.strip_prefix(cmd) {
            let (a, rest) = rest.split_once('}')?;
            let b = rest.strip_prefix('{')?.strip_suffix('}')?;
            let (a, b) = (parse_decimal(a)?, parse_decimal(b)?);
            let r = Rational::new(a.num.checked_mul(b.den)?, a.den.checked_mul(b.num)?)?;
            return Some(if neg {
                Rational {
                    num: -r.num,
                    den: r.den,
                }
            } else {
                r
            });
        }
    }
    if let Some((a, b)) = t.split_once('/') {
        let (a, b) = (parse_decimal(a)?, parse_decimal(b)?);
        return Rational::new(a.num.checked_mul(b.den)?, a.den.checked_mul(b.num)?);
    }
    parse_decimal(&t)
}

/// The last number-like token of a line (`-1,234.5`, `3/4`), without trailing punctuation.
fn last_number(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let mut end = b.len();
    while end > 0 && !b[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0 && (b[start - 1].is_ascii_digit() || matches!(b[start - 1], b',' | b'.' | b'/'))
    {
        start -= 1;
    }
    while start < end && !b[start].is_ascii_digit() {
        start += 1;
    }
    if start > 0 && b[start - 1] == b'-' {
        start -= 1;
    }
    Some(&line[start..end])
}

/// The final answer stated at the end of a solution: the last `\boxed{…}`, else the text after
/// `####`, else after "answer is"/"answer:" on the last non-empty line, else that line's last
/// number.
pub fn solution_answer(solution: &str) -> Option<String> {
    if let Some(b) = last_boxed(solution) {
        return Some(b.trim().to_string());
    }
    if let Some((_, tail)) = solution.rsplit_once("####") {
        return tail
            .lines()
            .next()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty());
    }
    let last = solution.lines().rev().find(|l| !l.trim().is_empty())?;
    let lower = last.to_lowercase();
    for marker in ["answer is", "answer:"] {
        if let Some(i) = lower.rfind(marker) {
            let tail = last[i + marker.len()..].trim();
            if parse_answer(tail).is_some() {
                return Some(tail.to_string());
            }
        }
    }
    last_number(last).map(str::to_string)
}

/// Why a row is removed (counter names in the run record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    NoSolution,
    NoAnswer,
    UnparseableAnswer,
    AnswerMismatch,
    SolutionLength,
    Duplicate,
}

impl Rule {
    pub const ALL: [Rule; 6] = [
        Rule::NoSolution,
        Rule::NoAnswer,
        Rule::UnparseableAnswer,
        Rule::AnswerMismatch,
        Rule::SolutionLength,
        Rule::Duplicate,
    ];

    pub fn counter(self) -> &'static str {
        match self {
            Rule::NoSolution => "removed_no_solution",
            Rule::NoAnswer => "removed_no_answer",
            Rule::UnparseableAnswer => "removed_unparseable_answer",
            Rule::AnswerMismatch => "removed_answer_mismatch",
            Rule::SolutionLength => "removed_solution_length",
            Rule::Duplicate => "removed_duplicate",
        }
    }
}

/// Length bounds and how to count.
pub struct Bounds<'a> {
    pub min_tokens: usize,
    pub max_tokens: usize,
    pub count: &'a dyn Fn(&str) -> anyhow::Result<usize>,
}

/// The first rule `row` fails, or `None` to keep it; `seen` holds the kept prompts' hashes.
pub fn judge(
    row: &PromptRow,
    b: &Bounds,
    seen: &mut HashSet<String>,
) -> anyhow::Result<Option<Rule>> {
    let Some(solution) = row.solution.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok(Some(Rule::NoSolution));
    };
    let Some(answer) = row.answer.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok(Some(Rule::NoAnswer));
    };
    let Some(reference) = parse_answer(answer) else {
        return Ok(Some(Rule::UnparseableAnswer));
    };
    if solution_answer(solution).and_then(|a| parse_answer(&a)) != Some(reference) {
        return Ok(Some(Rule::AnswerMismatch));
    }
    let n = (b.count)(solution)?;
    if n < b.min_tokens || n > b.max_tokens {
        return Ok(Some(Rule::SolutionLength));
    }
    if !seen.insert(normalized_hash(&row.prompt)) {
        return Ok(Some(Rule::Duplicate));
    }
    Ok(None)
}

/// Stage `filter` (whitespace lengths) and `filter_tokens` (input `tokenizer`): input and output
/// `prompts`.
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let min_tokens: usize = ctx.param("min_tokens")?;
    let max_tokens: usize = ctx.param("max_tokens")?;
    if min_tokens > max_tokens {
        bail!("filter: min_tokens {min_tokens} > max_tokens {max_tokens}");
    }
    let input = ctx.input("prompts")?.to_path_buf();
    let rows: Vec<PromptRow> = read_rows(&input, Schema::Prompts)?;
    let tokenizer = match ctx.inputs.contains_key("tokenizer") {
        true => Some(super::tokenizer_train::load(ctx.input("tokenizer")?)?),
        false => None,
    };
    let count = |s: &str| -> anyhow::Result<usize> {
        match &tokenizer {
            Some(t) => Ok(t
                .encode(s, false)
                .map_err(|e| anyhow!("filter: tokenizing a solution: {e}"))?
                .len()),
            None => Ok(s.split_whitespace().count()),
        }
    };
    let bounds = Bounds {
        min_tokens,
        max_tokens,
        count: &count,
    };
    let mut seen = HashSet::new();
    let mut removed = [0i64; 6];
    let mut kept = Vec::new();
    for row in rows.iter() {
        match judge(row, &bounds, &mut seen)? {
            Some(rule) => removed[Rule::ALL.iter().position(|r| *r == rule).expect("rule")] += 1,
            None => kept.push(row.clone()),
        }
    }
    ctx.count("input_rows", rows.len() as i64);
    for (rule, n) in Rule::ALL.iter().zip(removed) {
        ctx.count(rule.counter(), n);
    }
    ctx.count("kept", kept.len() as i64);
    ctx.metric(
        "length_unit",
        if tokenizer.is_some() {
            "tokenizer"
        } else {
            "whitespace"
        },
    );
    if kept.is_empty() {
        let report: Vec<String> = Rule::ALL
            .iter()
            .zip(removed)
            .map(|(r, n)| format!("{} {n}", r.counter()))
            .collect();
        bail!(
            "{}: filter removed all {} rows ({}); an empty dataset is not passed on",
            input.display(),
            rows.len(),
            report.join(", ")
        );
    }
    write_rows(ctx.output("prompts")?, Schema::Prompts, &kept)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i128, d: i128) -> Option<Rational> {
        Rational::new(n, d)
    }

    #[test]
    fn numbers_normalize_to_exact_rationals() {
        let cases: &[(&str, Option<Rational>)] = &[
            ("42", r(42, 1)),
            (" -7 ", r(-7, 1)),
            ("1,000", r(1000, 1)),
            ("1,000,000.50", r(2000001, 2)),
            ("3.50", r(7, 2)),
            (".5", r(1, 2)),
            ("3/4", r(3, 4)),
            ("6/8", r(3, 4)),
            ("\\frac{3}{4}", r(3, 4)),
            ("-\\dfrac{10}{4}", r(-5, 2)),
            ("$18", r(18, 1)),
            ("\\$18.00", r(18, 1)),
            ("25%", r(25, 1)),
            ("\\boxed{12}", r(12, 1)),
            ("$\\boxed{\\frac{1}{2}}$", r(1, 2)),
            ("72.", r(72, 1)),
            ("\u{2212}3", r(-3, 1)),
            ("2x", None),
            ("12,34", None),
            ("1/0", None),
            ("", None),
            ("seven", None),
            ("\\sqrt{2}", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_answer(s), *want, "{s:?}");
        }
    }

    #[test]
    fn final_answers_are_found_at_the_end_of_solutions() {
        assert_eq!(
            solution_answer("Add 5: 12 + 5 = 17\nThe answer is 17.").as_deref(),
            Some("17.")
        );
        assert_eq!(
            solution_answer("so $x = \\boxed{\\frac{1}{2}}$ done").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(solution_answer("a\n#### 1,200\n").as_deref(), Some("1,200"));
        assert_eq!(
            solution_answer("He has 48+24 = <<48+24=72>>72 clips.\n").as_deref(),
            Some("72")
        );
        assert_eq!(
            solution_answer("1 foot / 10 feet * 100% = 10%").as_deref(),
            Some("10")
        );
        assert_eq!(
            solution_answer("The total is -3 degrees.").as_deref(),
            Some("-3")
        );
        assert_eq!(solution_answer("no numbers here"), None);
    }

    fn row(prompt: &str, solution: Option<&str>, answer: Option<&str>) -> PromptRow {
        PromptRow {
            id: prompt.into(),
            prompt: prompt.into(),
            answer: answer.map(Into::into),
            solution: solution.map(Into::into),
            source: "t".into(),
            meta: "{}".into(),
        }
    }

    #[test]
    fn each_rule_removes_what_it_should() {
        let ws = |s: &str| Ok(s.split_whitespace().count());
        let b = Bounds {
            min_tokens: 3,
            max_tokens: 8,
            count: &ws,
        };
        let mut seen = HashSet::new();
        let mut j = |r: &PromptRow| judge(r, &b, &mut seen).unwrap();
        assert_eq!(j(&row("p1", None, Some("1"))), Some(Rule::NoSolution));
        assert_eq!(j(&row("p1", Some("  "), Some("1"))), Some(Rule::NoSolution));
        assert_eq!(j(&row("p1", Some("1 + 1 = 2"), None)), Some(Rule::NoAnswer));
        assert_eq!(
            j(&row("p1", Some("1 + 1 = 2"), Some(""))),
            Some(Rule::NoAnswer)
        );
        assert_eq!(
            j(&row("p1", Some("x + x = 2x"), Some("2x"))),
            Some(Rule::UnparseableAnswer)
        );
        assert_eq!(
            j(&row("p1", Some("1 + 1 = 2"), Some("3"))),
            Some(Rule::AnswerMismatch)
        );
        assert_eq!(
            j(&row("p1", Some("no number at the end"), Some("3"))),
            Some(Rule::AnswerMismatch)
        );
        assert_eq!(
            j(&row("p1", Some("= 2"), Some("2"))),
            Some(Rule::SolutionLength)
        );
        assert_eq!(
            j(&row(
                "p1",
                Some("one two three four five six seven = 2"),
                Some("2")
            )),
            Some(Rule::SolutionLength)
        );
        assert_eq!(
            j(&row("What is 1+1?", Some("1 + 1 = 2"), Some("2.0"))),
            None
        );
        assert_eq!(
            j(&row("what is  1+1? ", Some("1 + 1 = 2\nSo 2."), Some("2"))),
            Some(Rule::Duplicate)
        );
        let chat = r#"[{"role":"user","content":"WHAT IS 1+1?"}]"#;
        assert_eq!(
            j(&row(chat, Some("1 + 1 = 2"), Some("2"))),
            Some(Rule::Duplicate)
        );
        assert_eq!(
            j(&row(
                "What is 1+2?",
                Some("1 + 2 = 3"),
                Some("\\frac{6}{2}")
            )),
            None
        );
    }

    #[test]
    fn taskgen_problems_all_pass_and_imported_gsm8k_mostly_does() {
        let k = crate::stages::taskgen::Knobs {
            min_steps: 1,
            max_steps: 5,
            max_operand: 50,
            max_value: 500,
            distractors: 2,
            word_fraction: 0.5,
        };
        let (train, _) = crate::stages::taskgen::splits(2, &k, 500, 10).unwrap();
        for p in &train {
            assert_eq!(
                solution_answer(&p.solution).and_then(|a| parse_answer(&a)),
                Rational::new(p.answer as i128, 1),
                "{}",
                p.solution
            );
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/gsm8k-mgs/gsm8k-mgs-eng.jsonl");
        let (src, cols) = crate::stages::import::read_source(&path).unwrap();
        let m = crate::stages::import::Mapping::new(
            crate::stages::import::Layout::Gsm8k,
            "",
            "",
            "",
            "",
        );
        let (rows, _) = crate::stages::import::convert(&path, src, &cols, &m, "gsm8k").unwrap();
        let ws = |s: &str| Ok(s.split_whitespace().count());
        let b = Bounds {
            min_tokens: 1,
            max_tokens: 1024,
            count: &ws,
        };
        let mut seen = HashSet::new();
        let removed: Vec<(usize, Rule)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| judge(r, &b, &mut seen).unwrap().map(|rule| (i, rule)))
            .collect();
        // Row 59 ends "… <<9+4=13>>13 liters of water out of the 21 liters." with answer 13: the
        // last number of the last line is 21, so the strict end-of-solution rule drops it.
        assert_eq!(removed, vec![(59, Rule::AnswerMismatch)]);
    }
}
