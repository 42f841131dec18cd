//! `filter` / `filter_tokens`: the open-rr rules (paper Table 2 data) over a prompts artifact.
//!
//! A row is kept when it (in this order; a row is counted under the first rule it fails):
//! 1. has a reference solution (`removed_no_solution`),
//! 2. has a reference answer (`removed_no_answer`),
//! 3. whose answer reads as an answer to the verifier (`removed_unparseable_answer`),
//! 4. stated by the solution (`removed_answer_mismatch`),
//! 5. with a solution length in `[min_tokens, max_tokens]` (`removed_solution_length`): tokens of
//!    the `tokenizer` input for `filter_tokens`, whitespace-separated words for `filter` (the
//!    run record's `length_unit` metric says which),
//! 6. and whose normalized prompt was not seen in an earlier row (`removed_duplicate`).
//!
//! Rules 3 and 4 are the verifier's ([`crate::math::states_answer`]): numbers, expressions and
//! sentence answers; a solution states the answer it marks (`\boxed{}`, "the answer is", `####`)
//! or, without a marker, one in its final sentence ("there are 89 ways to tile a 2 x 21
//! rectangle" states 89). Every removed row is listed with its rule in the `skipped` table and
//! counted on stderr. An empty result is an error.

use std::collections::HashMap;

use anyhow::{anyhow, bail};

use crate::prompt_text::normalized_hash;
use super::skipped::{self, SkippedRow};
use crate::artifact::rows::PromptRow;
use crate::artifact::{read_rows, write_rows, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::math;

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

/// A removed row's rule and what was found (for the `skipped` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub rule: Rule,
    pub detail: String,
}

/// The first rule `row` fails, or `None` to keep it; `seen` maps the kept prompts' hashes to
/// their ids.
pub fn judge(
    row: &PromptRow,
    b: &Bounds,
    seen: &mut HashMap<String, String>,
) -> anyhow::Result<Option<Removal>> {
    let removal = |rule, detail: String| Ok(Some(Removal { rule, detail }));
    let Some(solution) = row.solution.as_deref().filter(|s| !s.trim().is_empty()) else {
        return removal(Rule::NoSolution, String::new());
    };
    let Some(answer) = row.answer.as_deref().filter(|s| !s.trim().is_empty()) else {
        return removal(Rule::NoAnswer, String::new());
    };
    match math::states_answer(answer, solution) {
        None => return removal(Rule::UnparseableAnswer, format!("answer {answer:?}")),
        Some(false) => {
            let stated = math::extract_answer(solution).unwrap_or_default();
            return removal(
                Rule::AnswerMismatch,
                format!("answer {answer:?}, solution states {stated:?}"),
            );
        }
        Some(true) => {}
    }
    let n = (b.count)(solution)?;
    if n < b.min_tokens || n > b.max_tokens {
        return removal(
            Rule::SolutionLength,
            format!("{n} not in [{}, {}]", b.min_tokens, b.max_tokens),
        );
    }
    let hash = normalized_hash(&row.prompt);
    if let Some(first) = seen.get(&hash) {
        return removal(Rule::Duplicate, format!("same prompt as {first}"));
    }
    seen.insert(hash, row.id.clone());
    Ok(None)
}

/// The stage's params (stages/filter.toml documents them); unknown or mistyped ones are errors naming
/// the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilterParams {
    min_tokens: usize,
    max_tokens: usize,
}

pub const STAGE: Builtin = Builtin { name: "filter", version: "8", runs_in: Executable::Engine, run };

/// Stage `filter` (whitespace lengths) and `filter_tokens` (input `tokenizer`): input and output
/// `prompts`.
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let FilterParams { min_tokens, max_tokens } = ctx.params()?;
    if min_tokens > max_tokens {
        bail!("filter: min_tokens {min_tokens} > max_tokens {max_tokens}");
    }
    let input = ctx.input("prompts")?.to_path_buf();
    let rows: Vec<PromptRow> = read_rows(&input, Schema::Prompts)?;
    let tokenizer = match ctx.inputs.contains_key("tokenizer") {
        true => Some(crate::tokenizer_file::load(ctx.input("tokenizer")?)?),
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
    let mut seen = HashMap::new();
    let mut removed = [0i64; 6];
    let mut kept = Vec::new();
    let mut skipped_rows = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        match judge(row, &bounds, &mut seen)? {
            Some(r) => {
                removed[Rule::ALL.iter().position(|x| *x == r.rule).expect("rule")] += 1;
                skipped_rows.push(SkippedRow {
                    stage: "filter".into(),
                    row: i as i64,
                    id: Some(row.id.clone()),
                    reason: r.rule.counter().into(),
                    detail: r.detail,
                });
            }
            None => kept.push(row.clone()),
        }
    }
    skipped::write(ctx, "filter", &skipped_rows)?;
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
        let mut seen = HashMap::new();
        let mut j = |r: &PromptRow| judge(r, &b, &mut seen).unwrap().map(|r| r.rule);
        assert_eq!(j(&row("p1", None, Some("1"))), Some(Rule::NoSolution));
        assert_eq!(j(&row("p1", Some("  "), Some("1"))), Some(Rule::NoSolution));
        assert_eq!(j(&row("p1", Some("1 + 1 = 2"), None)), Some(Rule::NoAnswer));
        assert_eq!(
            j(&row("p1", Some("1 + 1 = 2"), Some(""))),
            Some(Rule::NoAnswer)
        );
        assert_eq!(
            j(&row("p1", Some("so it is 1/2"), Some("\\frac{1}{"))),
            Some(Rule::UnparseableAnswer)
        );
        // A gold in words is read as words now (issue 18), and a solution that states no answer
        // does not state it.
        assert_eq!(
            j(&row(
                "p1",
                Some("so it is Tuesday"),
                Some("\\text{Tuesday}")
            )),
            Some(Rule::AnswerMismatch)
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
        // A symbolic answer is an answer now (it used to be `unparseable`).
        assert_eq!(
            j(&row("p2", Some("So x + x = \\boxed{2x}"), Some("2x"))),
            None
        );
    }

    // Issue 18: the last number of the last line is not always the answer.
    #[test]
    fn the_answer_is_read_from_the_final_sentence_not_its_last_number() {
        let ws = |s: &str| Ok(s.split_whitespace().count());
        let b = Bounds {
            min_tokens: 1,
            max_tokens: 100,
            count: &ws,
        };
        let mut seen = HashMap::new();
        let tiling = "The counts follow the Fibonacci numbers.\nThere are 89 ways to tile a 2 x 21 rectangle.";
        assert_eq!(
            judge(&row("t", Some(tiling), Some("89")), &b, &mut seen).unwrap(),
            None
        );
        let min = "The minimum is 2, which can be achieved by a=1 and b=1.";
        assert_eq!(
            judge(&row("m", Some(min), Some("2")), &b, &mut seen).unwrap(),
            None
        );
        let r = judge(&row("w", Some(tiling), Some("90")), &b, &mut seen).unwrap();
        assert_eq!(r.as_ref().map(|r| r.rule), Some(Rule::AnswerMismatch));
        assert!(r.unwrap().detail.contains("\"90\""));
    }

    #[test]
    fn taskgen_problems_all_pass_and_imported_gsm8k_all_do() {
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
                math::states_answer(&p.answer.to_string(), &p.solution),
                Some(true),
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
        let (rows, _, _) = crate::stages::import::convert(&path, src, &cols, &m, "gsm8k").unwrap();
        let ws = |s: &str| Ok(s.split_whitespace().count());
        let b = Bounds {
            min_tokens: 1,
            max_tokens: 1024,
            count: &ws,
        };
        let mut seen = HashMap::new();
        let removed: Vec<(usize, Rule)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| judge(r, &b, &mut seen).unwrap().map(|x| (i, x.rule)))
            .collect();
        // Row 59 ends "… <<9+4=13>>13 liters of water out of the 21 liters." with answer 13: the
        // old last-number rule removed it; its final sentence states 13.
        assert_eq!(removed, vec![]);
    }
}
