//! The first wrong step of a trace of the default world's task, known exactly (issue 19's
//! ground truth for credit assignment).
//!
//! `taskgen`'s reference solution u* is one line per step inside `<think> … </think>`:
//! `Start with 9.` (or `Mia starts with 9 apples.`), then `Add 5: 9 + 5 = 14`, … A trace of a
//! policy trained on that language is checked line by line against it: line k of the thinking must
//! state the right start value (k = 0), or perform the problem's k-th operation with the right
//! operand, on the value the previous line stated, with correct integer arithmetic (a division must
//! be exact). The first line that fails one of these checks is the first wrong step; every line
//! before it is verified correct, so the error is not a consequence of an earlier one. Closing the
//! thinking before the last step is a wrong step at the `</think>` line; a step after the last one
//! is a wrong step too. A line that does not parse as a step stops the check (`Unparseable`): the
//! trace has no located error, so the benchmark leaves it out (counted), rather than guessing.
//!
//! Knows nothing of tokens: spans are byte ranges of the text; callers map them to segments.

use std::ops::Range;

use anyhow::{bail, Result};

use crate::credit::thinking::{THINK_CLOSE, THINK_OPEN};

/// One arithmetic step as written: `Verb operand: lhs symbol rhs = result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    op: char,
    operand: i64,
    lhs: i64,
    symbol: char,
    rhs: i64,
    result: i64,
}

/// A line of the thinking, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Start(i64),
    Step(Step),
}

/// What makes a line wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The start line states another start value.
    WrongStart,
    /// Not the problem's operation or operand at this step.
    WrongOperation,
    /// The line contradicts itself (`Add 5: 9 * 5 = 45`).
    Inconsistent,
    /// The left operand is not the value the previous line stated (a copying error).
    WrongCarry,
    /// lhs ∘ rhs ≠ result (or a division with a remainder).
    WrongArithmetic,
    /// A step after the problem's last one.
    ExtraStep,
    /// `</think>` before the problem's last step.
    EarlyEnd,
    /// A number used in a computation that is neither in the problem nor earlier in the trace
    /// (free-form traces, [`super::first_wrong_arith`]).
    UnsupportedValue,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::WrongStart => "wrong_start",
            ErrorKind::WrongOperation => "wrong_operation",
            ErrorKind::Inconsistent => "inconsistent",
            ErrorKind::WrongCarry => "wrong_carry",
            ErrorKind::WrongArithmetic => "wrong_arithmetic",
            ErrorKind::ExtraStep => "extra_step",
            ErrorKind::EarlyEnd => "early_end",
            ErrorKind::UnsupportedValue => "unsupported_value",
        }
    }
}

/// The check of one trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The first wrong step: `line` (0-based over the text's lines), its byte span (trimmed).
    Wrong { line: usize, span: Range<usize>, kind: ErrorKind },
    /// Every line of the thinking is right (an incorrect trace then errs after it, in the answer).
    NoError,
    /// A line (before any wrong one) is not a step of the language.
    Unparseable { line: usize, span: Range<usize> },
    /// The thinking never closes and no wrong line came before its end.
    Unclosed,
    /// A free-form trace with no computation to check ([`super::first_wrong_arith`]).
    Unchecked,
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Wrong { kind, .. } => kind.as_str(),
            Verdict::NoError => "no_error",
            Verdict::Unparseable { .. } => "unparseable",
            Verdict::Unclosed => "unclosed",
            Verdict::Unchecked => "unchecked",
        }
    }
}

fn int(s: &str) -> Option<i64> {
    let s = s.trim();
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `Start with 9.` / `Mia starts with 9 apples.`: the one integer of a line that says "start".
fn parse_start(line: &str) -> Option<i64> {
    if !line.to_ascii_lowercase().contains("start") {
        return None;
    }
    let numbers: Vec<i64> = line.split(|c: char| !(c.is_ascii_digit() || c == '-')).filter_map(int).collect();
    match numbers.as_slice() {
        [n] => Some(*n),
        _ => None,
    }
}

/// `Add 5: 9 + 5 = 14` (verbs: Add, Subtract, Multiply by, Divide by).
fn parse_step(line: &str) -> Option<Step> {
    let (head, body) = line.split_once(':')?;
    let (op, operand) = [("Add ", '+'), ("Subtract ", '-'), ("Multiply by ", '*'), ("Divide by ", '/')]
        .iter()
        .find_map(|(verb, op)| Some((*op, int(head.trim().strip_prefix(verb)?)?)))?;
    let (expr, result) = body.split_once('=')?;
    let result = int(result)?;
    let words: Vec<&str> = expr.split_whitespace().collect();
    let [lhs, symbol, rhs] = words.as_slice() else { return None };
    let symbol = match *symbol {
        "+" | "-" | "*" | "/" => symbol.chars().next()?,
        _ => return None,
    };
    Some(Step { op, operand, lhs: int(lhs)?, symbol, rhs: int(rhs)?, result })
}

fn parse_line(line: &str) -> Option<Line> {
    parse_step(line).map(Line::Step).or_else(|| parse_start(line).map(Line::Start))
}

/// Is `lhs op rhs = result` true in the task's integer arithmetic?
fn arithmetic_holds(op: char, lhs: i64, rhs: i64, result: i64) -> bool {
    match op {
        '+' => lhs.checked_add(rhs) == Some(result),
        '-' => lhs.checked_sub(rhs) == Some(result),
        '*' => lhs.checked_mul(rhs) == Some(result),
        '/' => rhs != 0 && rhs.checked_mul(result) == Some(lhs),
        _ => false,
    }
}

/// Non-empty lines of `text` as (line index, trimmed byte span).
fn lines(text: &str) -> Vec<(usize, Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 0;
    for (i, raw) in text.split('\n').enumerate() {
        let lead = raw.len() - raw.trim_start().len();
        let trimmed = raw.trim();
        if !trimmed.is_empty() {
            out.push((i, at + lead..at + lead + trimmed.len()));
        }
        at += raw.len() + 1;
    }
    out
}

/// The start value and the steps (op, operand) of a reference solution, or why it is not one.
pub fn reference_steps(solution: &str) -> Result<(i64, Vec<(char, i64)>)> {
    let mut start = None;
    let mut steps = Vec::new();
    for (i, span) in lines(solution) {
        let line = &solution[span];
        if line == THINK_OPEN {
            continue;
        }
        if line == THINK_CLOSE {
            break;
        }
        match (parse_line(line), start) {
            (Some(Line::Start(v)), None) => start = Some(v),
            (Some(Line::Step(s)), Some(_)) if arithmetic_holds(s.op, s.lhs, s.rhs, s.result) && s.symbol == s.op => steps.push((s.op, s.operand)),
            _ => bail!("line {}: `{line}` is not a step of the task's worked solutions", i + 1),
        }
    }
    match start {
        Some(v) if !steps.is_empty() => Ok((v, steps)),
        _ => bail!("no start line and steps inside {THINK_OPEN} … {THINK_CLOSE}"),
    }
}

/// The first wrong step of `trace` against the reference (start value and steps).
pub fn first_wrong(trace: &str, start: i64, steps: &[(char, i64)]) -> Verdict {
    let mut value: Option<i64> = None;
    let mut done = 0;
    for (line, span) in lines(trace) {
        let text = &trace[span.clone()];
        let wrong = |kind| Verdict::Wrong { line, span: span.clone(), kind };
        if text == THINK_OPEN {
            continue;
        }
        if text.starts_with(THINK_CLOSE) {
            return if value.is_some() && done == steps.len() { Verdict::NoError } else { wrong(ErrorKind::EarlyEnd) };
        }
        let Some(parsed) = parse_line(text) else {
            return Verdict::Unparseable { line, span };
        };
        match (parsed, value) {
            (Line::Start(v), None) if v == start => value = Some(v),
            (Line::Start(_), None) => return wrong(ErrorKind::WrongStart),
            (Line::Step(_), None) => return wrong(ErrorKind::WrongStart),
            (Line::Start(_), Some(_)) => return Verdict::Unparseable { line, span },
            (Line::Step(s), Some(v)) => {
                let Some(&(op, operand)) = steps.get(done) else { return wrong(ErrorKind::ExtraStep) };
                if (s.op, s.operand) != (op, operand) {
                    return wrong(ErrorKind::WrongOperation);
                }
                if s.symbol != s.op || s.rhs != s.operand {
                    return wrong(ErrorKind::Inconsistent);
                }
                if s.lhs != v {
                    return wrong(ErrorKind::WrongCarry);
                }
                if !arithmetic_holds(s.op, s.lhs, s.rhs, s.result) {
                    return wrong(ErrorKind::WrongArithmetic);
                }
                value = Some(s.result);
                done += 1;
            }
        }
    }
    Verdict::Unclosed
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 14 * 3 = 42\nDivide by 6: 42 / 6 = 7\n</think>\nThe answer is 7.";

    fn check(trace: &str) -> Verdict {
        let (start, steps) = reference_steps(REFERENCE).unwrap();
        first_wrong(trace, start, &steps)
    }

    fn wrong_at(trace: &str) -> (usize, &str, ErrorKind) {
        match check(trace) {
            Verdict::Wrong { line, span, kind } => (line, &trace[span], kind),
            other => panic!("expected a located error, got {other:?}"),
        }
    }

    #[test]
    fn the_reference_parses_into_its_start_and_steps() {
        assert_eq!(reference_steps(REFERENCE).unwrap(), (9, vec![('+', 5), ('*', 3), ('/', 6)]));
        let word = "<think>\nMia starts with 12 apples.\nSubtract 4: 12 - 4 = 8\n</think>\nThe answer is 8.";
        assert_eq!(reference_steps(word).unwrap(), (12, vec![('-', 4)]));
        let err = reference_steps("The answer is 7.").unwrap_err().to_string();
        assert!(err.contains("is not a step"), "{err}");
    }

    #[test]
    fn a_wrong_product_in_line_2_is_located_there() {
        let trace = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 14 * 3 = 43\nDivide by 6: 43 / 6 = 7\n</think>\nThe answer is 7.";
        assert_eq!(wrong_at(trace), (3, "Multiply by 3: 14 * 3 = 43", ErrorKind::WrongArithmetic));
    }

    #[test]
    fn a_correct_line_on_a_wrong_earlier_value_is_not_blamed_the_earlier_line_is() {
        // Line 3 is wrong; line 4's arithmetic is right on line 3's wrong value.
        let trace = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 14 * 3 = 48\nDivide by 6: 48 / 6 = 8\n</think>\nThe answer is 8.";
        assert_eq!(wrong_at(trace).0, 3);
        // A line whose arithmetic holds but which uses another value than the previous result.
        let carry = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 15 * 3 = 45\n</think>";
        assert_eq!(wrong_at(carry), (3, "Multiply by 3: 15 * 3 = 45", ErrorKind::WrongCarry));
    }

    #[test]
    fn a_trace_with_no_error_has_no_first_wrong_step() {
        assert_eq!(check(REFERENCE), Verdict::NoError);
    }

    #[test]
    fn an_unparseable_line_stops_the_check_unless_an_error_came_first() {
        let trace = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nthen we multiply\nDivide by 6: 42 / 6 = 7\n</think>";
        assert_eq!(check(trace), Verdict::Unparseable { line: 3, span: trace.find("then").unwrap()..trace.find("then").unwrap() + 16 });
        let after = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 15\nthen we multiply\n</think>";
        assert_eq!(wrong_at(after).2, ErrorKind::WrongArithmetic);
    }

    #[test]
    fn each_kind_of_error_is_named() {
        let cases = [
            ("<think>\nStart with 8.\nAdd 5: 8 + 5 = 13", 1, ErrorKind::WrongStart),
            ("<think>\nStart with 9.\nAdd 4: 9 + 4 = 13", 2, ErrorKind::WrongOperation),
            ("<think>\nStart with 9.\nSubtract 5: 9 - 5 = 4", 2, ErrorKind::WrongOperation),
            ("<think>\nStart with 9.\nAdd 5: 9 * 5 = 45", 2, ErrorKind::Inconsistent),
            ("<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 14 * 3 = 42\nDivide by 6: 42 / 6 = 7\nAdd 2: 7 + 2 = 9\n</think>", 5, ErrorKind::ExtraStep),
            ("<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\n</think>\nThe answer is 14.", 3, ErrorKind::EarlyEnd),
            ("<think>\nAdd 5: 9 + 5 = 14", 1, ErrorKind::WrongStart),
        ];
        for (trace, line, kind) in cases {
            let (l, _, k) = wrong_at(trace);
            assert_eq!((l, k), (line, kind), "{trace:?}");
        }
        // Division must be exact (the task divides only by divisors).
        let inexact = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14\nMultiply by 3: 14 * 3 = 42\nDivide by 6: 42 / 6 = 8";
        assert_eq!(wrong_at(inexact), (4, "Divide by 6: 42 / 6 = 8", ErrorKind::WrongArithmetic));
        let ok_then_cut = "<think>\nStart with 9.\nAdd 5: 9 + 5 = 14";
        assert_eq!(check(ok_then_cut), Verdict::Unclosed);
    }

    #[test]
    fn word_problem_start_lines_and_signs_parse() {
        assert_eq!(parse_start("Mia starts with 12 apples."), Some(12));
        assert_eq!(parse_start("Start with 3 and 4."), None);
        assert_eq!(parse_step("Subtract 9: 3 - 9 = -6").map(|s| s.result), Some(-6));
        assert_eq!(parse_step("Add five: 3 + 5 = 8"), None);
        assert!(!arithmetic_holds('/', 43, 6, 7));
        assert!(arithmetic_holds('/', 42, 6, 7));
    }
}
