//! The first wrong step of a free-form arithmetic trace (a real model on GSM8K-style problems):
//! the ground truth of the credit benchmark where no worked solution line-up exists.
//!
//! A real model writes its own steps (`She sells 16 - 3 - 4 = 9 eggs.`, `$9 \times 2 = 18$`,
//! GSM8K's `<<9*2=18>>`), so a line cannot be matched to a reference step the way
//! [`super::first_wrong`] does for the default world. What can be checked exactly is what a line
//! claims: every `expression = number` in it must hold, and every number the expression uses must
//! be known when the line uses it — stated in the problem, written earlier in the trace (a result
//! or any number before), or a common constant (small integers, 12, 24, 60, 100, …). The first
//! line that breaks either is the first wrong step: a false computation, or a value from nowhere
//! (a miscopied carry). Every line before it is checked true, so the error is not a consequence of
//! an earlier one. A trace with no false claim has no located error (`no_error`, even when its
//! answer is wrong: its error is in reasoning the check cannot see); one with no checkable claim
//! at all is `unchecked`. Lines without an `=` are not claims and pass.
//!
//! Knows nothing of tokens: spans are byte ranges of the text; callers map them to segments.

use std::ops::Range;

use super::first_wrong::{ErrorKind, Verdict};
use crate::math::parse::{parse_answer, Answer};

/// Numbers a line may use without having seen them: small integers and the unit conversions a
/// word problem takes for granted (dozen, hours, days, weeks, months, percent, thousand).
const CONSTANTS: &[f64] = &[12.0, 24.0, 30.0, 52.0, 60.0, 100.0, 365.0, 1000.0];

/// Number words of problem statements, as values (`twice` → 2, `half` → 2 and 0.5).
const WORDS: &[(&str, &[f64])] = &[
    ("one", &[1.0]),
    ("two", &[2.0]),
    ("three", &[3.0]),
    ("four", &[4.0]),
    ("five", &[5.0]),
    ("six", &[6.0]),
    ("seven", &[7.0]),
    ("eight", &[8.0]),
    ("nine", &[9.0]),
    ("ten", &[10.0]),
    ("eleven", &[11.0]),
    ("twelve", &[12.0]),
    ("fifteen", &[15.0]),
    ("twenty", &[20.0]),
    ("thirty", &[30.0]),
    ("forty", &[40.0]),
    ("fifty", &[50.0]),
    ("hundred", &[100.0]),
    ("dozen", &[12.0]),
    ("twice", &[2.0]),
    ("double", &[2.0]),
    ("triple", &[3.0]),
    ("half", &[2.0, 0.5]),
    ("quarter", &[4.0, 0.25]),
    ("third", &[3.0]),
];

/// Characters an arithmetic expression is written with (after [`plain`]).
fn is_arith(c: char) -> bool {
    c.is_ascii_digit() || " .+-*/^()%".contains(c)
}

/// A line with LaTeX/Unicode operators, math delimiters and markdown emphasis turned into plain
/// ASCII arithmetic (`$9 \times 2$` → `9 * 2`, `3 x 4` → `3 * 4`), and thousands separators
/// dropped (`1,200` → `1200`). Lengths change, so the caller keeps the original line's span.
fn plain(line: &str) -> String {
    let mut s = line.to_string();
    for (from, to) in [("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("×", "*"), ("·", "*"), ("⋅", "*"), ("÷", "/"), ("−", "-"), ("**", " "), ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "), ("\\,", ""), ("\\%", "%"), ("$", " ")] {
        s = s.replace(from, to);
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        let digit_at = |j: Option<usize>| j.and_then(|j| chars.get(j)).is_some_and(|c| c.is_ascii_digit());
        // `1,200`: a comma between a digit and exactly three digits is a thousands separator.
        if c == ',' && digit_at(i.checked_sub(1)) && (1..=3).all(|k| digit_at(Some(i + k))) && !digit_at(Some(i + 4)) {
            continue;
        }
        // `3 x 4`: an `x` standing alone between numbers is a times sign.
        if c == 'x' && i > 0 && chars.get(i + 1) == Some(&' ') && chars[i - 1] == ' ' {
            let before = chars[..i].iter().rev().find(|c| **c != ' ');
            let after = chars[i + 1..].iter().find(|c| **c != ' ');
            if before.is_some_and(|c| c.is_ascii_digit()) && after.is_some_and(|c| c.is_ascii_digit()) {
                out.push('*');
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// The value of a plain arithmetic expression, if it is one.
fn value(expr: &str) -> Option<f64> {
    let expr = expr.trim().trim_end_matches('.');
    match parse_answer(expr).ok()? {
        Answer::Number(n) => Some(n.resolved().approx).filter(|v| v.is_finite()),
        _ => None,
    }
}

/// The numbers written in `text` (digits, with a decimal part), in order, with their byte
/// offsets.
fn numbers(text: &str) -> Vec<(usize, f64)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        if let Ok(v) = text[start..i].parse::<f64>() {
            out.push((start, v));
        }
    }
    out
}

/// Values a problem statement makes known: its numbers (a percentage also as a fraction) and
/// number words.
fn problem_values(problem: &str) -> Vec<f64> {
    let text = plain(problem);
    let mut known = Vec::new();
    for (o, v) in numbers(&text) {
        known.push(v);
        let end = text[o..].find(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(text.len(), |e| o + e);
        if text[end..].trim_start().starts_with('%') {
            known.push(v / 100.0);
        }
    }
    let lower = problem.to_ascii_lowercase();
    for word in lower.split(|c: char| !c.is_ascii_alphabetic()) {
        let word = word.strip_suffix('s').filter(|w| WORDS.iter().any(|(k, _)| k == w)).unwrap_or(word);
        if let Some((_, values)) = WORDS.iter().find(|(k, _)| *k == word) {
            known.extend_from_slice(values);
        }
    }
    known
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn is_known(v: f64, known: &[f64]) -> bool {
    (v.fract() == 0.0 && (0.0..=10.0).contains(&v)) || CONSTANTS.iter().chain(known).any(|&k| same(k, v))
}

/// Does `lhs = rhs` hold, allowing the rounding the right side's written precision implies
/// (`10 / 3 = 3.33` holds; `10 / 3 = 3.5` does not)?
fn holds(lhs: f64, rhs: f64, rhs_text: &str) -> bool {
    if same(lhs, rhs) {
        return true;
    }
    let text = rhs_text.trim();
    let decimals = text.trim_end_matches('%').split_once('.').map_or(0, |(_, f)| f.len() as i32);
    // A percent's digits are hundredths of its value.
    let unit = if text.ends_with('%') { 0.01 } else { 1.0 };
    decimals > 0 && (lhs - rhs).abs() <= unit * 0.5 * 10f64.powi(-decimals) + 1e-12
}

/// One claim `lhs = rhs` of a line, on its plain text.
#[derive(Debug, Clone, PartialEq)]
struct Claim {
    /// Byte range of the left side in the plain line.
    lhs: Range<usize>,
    lhs_value: f64,
    rhs_text: String,
    rhs_value: f64,
    /// The right side's first number, when the right side goes on computing (`16 - 3 = 13 - 4 = 9`
    /// claims 16 - 3 = 13, then 13 - 4 = 9: a chain, not 16 - 3 = 9).
    rhs_first: Option<(String, f64)>,
}

impl Claim {
    fn holds(&self) -> bool {
        holds(self.lhs_value, self.rhs_value, &self.rhs_text) || self.rhs_first.as_ref().is_some_and(|(t, v)| holds(self.lhs_value, *v, t))
    }
}

/// The checkable claims of a plain line: `expr = expr` where the left side holds an operator
/// between two numbers (`x = 5` and `= 5 apples` state, they do not compute).
fn claims(line: &str) -> Vec<Claim> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (eq, _) in line.match_indices('=') {
        let prev = eq.checked_sub(1).map(|i| b[i]);
        if matches!(prev, Some(b'<' | b'>' | b'!' | b'=')) || b.get(eq + 1) == Some(&b'=') {
            continue;
        }
        let mut start = eq;
        while start > 0 && is_arith(b[start - 1] as char) {
            start -= 1;
        }
        let mut end = eq + 1;
        while end < b.len() && is_arith(b[end] as char) {
            end += 1;
        }
        let mut lhs_text = line[start..eq].trim();
        // A list marker at the start of the line is no part of the expression (`- 3 + 4 = 7`,
        // `2. 3 + 4 = 7`, `2) 3 + 4 = 7`).
        if line[..start].trim().is_empty() {
            lhs_text = strip_list_marker(lhs_text);
        }
        // Unbalanced brackets at the edges come from the prose around the expression.
        let lhs_text = trim_unbalanced(lhs_text);
        let rhs_text = trim_unbalanced(line[eq + 1..end].trim().trim_end_matches('.'));
        let operator = lhs_text.char_indices().skip(1).any(|(_, c)| "+-*/^".contains(c));
        let rhs_numbers = numbers(rhs_text);
        if !operator || numbers(lhs_text).len() < 2 || rhs_numbers.is_empty() {
            continue;
        }
        // The expression goes on into letters (`2x + 3 + 4 = 9`, `= 7x`): an equation in unknowns,
        // not a computation; so does a left side that starts with a binary operator.
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let letter_before = !line[start..eq].starts_with(char::is_whitespace) && line[..start].chars().next_back().is_some_and(word);
        let letter_after = !line[eq + 1..end].ends_with(char::is_whitespace) && line[end..].chars().next().is_some_and(word);
        let binary_start = lhs_text.starts_with(['+', '*', '/', '^']);
        // Two numbers side by side would be read as a product (`2 3 + 4`): prose, not arithmetic.
        let juxtaposed = |t: &str| t.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w[0].ends_with(|c: char| c.is_ascii_digit() || c == '%') && w[1].starts_with(|c: char| c.is_ascii_digit()));
        if letter_before || letter_after || binary_start || juxtaposed(lhs_text) || juxtaposed(rhs_text) {
            continue;
        }
        let (Some(lhs_value), Some(rhs_value)) = (value(lhs_text), value(rhs_text)) else { continue };
        let rhs_first = (rhs_numbers.len() > 1).then(|| {
            let (o, _) = rhs_numbers[0];
            let len = rhs_text[o..].find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '%')).unwrap_or(rhs_text.len() - o);
            let text = rhs_text[o..o + len].to_string();
            let v = value(&text).unwrap_or(f64::NAN);
            (text, v)
        });
        let lhs_start = start + line[start..eq].find(lhs_text).unwrap_or(0);
        out.push(Claim { lhs: lhs_start..lhs_start + lhs_text.len(), lhs_value, rhs_text: rhs_text.to_string(), rhs_value, rhs_first });
    }
    out
}

/// `s` without a leading list marker: `- `, `2. `, `2) `.
fn strip_list_marker(s: &str) -> &str {
    if let Some(rest) = s.strip_prefix("- ") {
        return rest.trim_start();
    }
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    match s[digits..].strip_prefix(". ").or_else(|| s[digits..].strip_prefix(") ")) {
        Some(rest) if digits > 0 => rest.trim_start(),
        _ => s,
    }
}

/// `s` without a leading `(` or trailing `)` that has no partner inside it.
fn trim_unbalanced(mut s: &str) -> &str {
    loop {
        let depth = s.chars().fold(0i32, |d, c| d + (c == '(') as i32 - (c == ')') as i32);
        s = match depth {
            d if d > 0 && s.starts_with('(') => s[1..].trim_start(),
            d if d < 0 && s.ends_with(')') => s[..s.len() - 1].trim_end(),
            _ => return s,
        };
    }
}

/// The first wrong line of the chain of thought `cot` of an answer to `problem` (see the module
/// doc). Lines are 0-based over `cot`; spans are byte ranges of `cot` (the line, trimmed).
pub fn first_wrong_arithmetic(problem: &str, cot: &str) -> Verdict {
    let mut known = problem_values(problem);
    let mut checked = 0;
    let mut at = 0;
    for (i, raw) in cot.split('\n').enumerate() {
        let lead = raw.len() - raw.trim_start().len();
        let span = at + lead..at + lead + raw.trim().len();
        at += raw.len() + 1;
        let line = plain(raw);
        let line_numbers = numbers(&line);
        // Results of this line's earlier claims: in a chain `16 - 3 = 13 - 4 = 9` the second
        // claim computes with the first one's result.
        let mut results: Vec<f64> = Vec::new();
        for claim in claims(&line) {
            checked += 1;
            let mut earlier: Vec<f64> = line_numbers.iter().filter(|(o, _)| *o < claim.lhs.start).map(|(_, v)| *v).collect();
            earlier.extend(&results);
            for (_, v) in numbers(&line[claim.lhs.clone()]) {
                if !is_known(v, &known) && !earlier.iter().any(|&e| same(e, v)) {
                    return Verdict::Wrong { line: i, span, kind: ErrorKind::UnsupportedValue };
                }
            }
            if !claim.holds() {
                return Verdict::Wrong { line: i, span, kind: ErrorKind::WrongArithmetic };
            }
            results.push(claim.lhs_value);
        }
        known.extend(line_numbers.iter().map(|(_, v)| *v));
    }
    if checked == 0 {
        Verdict::Unchecked
    } else {
        Verdict::NoError
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBLEM: &str = "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?";

    fn wrong_at(trace: &str) -> (usize, &str, ErrorKind) {
        match first_wrong_arithmetic(PROBLEM, trace) {
            Verdict::Wrong { line, span, kind } => (line, &trace[span], kind),
            other => panic!("expected a located error in {trace:?}, got {other:?}"),
        }
    }

    #[test]
    fn a_wrong_product_in_line_2_is_located_there() {
        let trace = "Janet has 16 eggs and uses 3 + 4 = 7 of them.\nShe sells 16 - 7 = 9 eggs.\nShe makes 9 * 2 = 19 dollars.\nThe answer is 19.";
        assert_eq!(wrong_at(trace), (2, "She makes 9 * 2 = 19 dollars.", ErrorKind::WrongArithmetic));
    }

    #[test]
    fn a_correct_line_using_a_wrong_earlier_value_is_not_blamed_the_earlier_line_is() {
        // Line 1 is wrong (16 - 7 = 8); line 2's product is right on line 1's wrong value.
        let trace = "She uses 3 + 4 = 7 eggs.\nShe sells 16 - 7 = 8 eggs.\nShe makes 8 * 2 = 16 dollars.";
        assert_eq!(wrong_at(trace).0, 1);
        // A true line that uses a value stated nowhere before (9 miscopied as 11).
        let carry = "She uses 3 + 4 = 7 eggs.\nShe sells 16 - 7 = 9 eggs.\nShe makes 11 * 2 = 22 dollars.";
        assert_eq!(wrong_at(carry), (2, "She makes 11 * 2 = 22 dollars.", ErrorKind::UnsupportedValue));
    }

    #[test]
    fn a_trace_with_no_error_and_one_without_claims() {
        let right = "She uses 3 + 4 = 7 eggs.\n$16 - 7 = 9$ eggs are left.\nShe makes $9 \\times 2 = \\$18$.\nThe answer is 18.";
        assert_eq!(first_wrong_arithmetic(PROBLEM, right), Verdict::NoError);
        let prose = "She sells the eggs.\nSo she makes some money.\nThe answer is 18.";
        assert_eq!(first_wrong_arithmetic(PROBLEM, prose), Verdict::Unchecked);
    }

    #[test]
    fn unparseable_lines_are_prose_and_do_not_stop_the_check() {
        let trace = "Let's think step by step!!! ===\nShe uses 3 + 4 = 7 eggs.\nwell (hmm = ) she sells\nThen 9 * 2 = 20.";
        assert_eq!(wrong_at(trace).0, 3);
    }

    #[test]
    fn written_forms_of_a_computation_are_read() {
        for (line, holds_true) in [
            ("<<16-3-4=9>>9 eggs", true),
            ("<<16-3-4=8>>8 eggs", false),
            ("9 x 2 = 18", true),
            ("9 × 2 = 18", true),
            ("1,200 / 100 = 12", true),
            ("10 / 3 = 3.33", true),
            ("10 / 3 = 3.5", false),
            ("50% * 50% = 25%", true),
            ("(16 - 7) * 2 = 18", true),
            ("2 * 9 = 18 = 3 * 6", true),
            ("16 - 3 - 4 = 9 - 1 = 7", false),
            ("16 - 3 = 13 - 4 = 9", true),
            ("3/6=50%", true),
        ] {
            let verdict = first_wrong_arithmetic("16 eggs, 3, 4, 2 dollars, 1,200, 10 and 50%", line);
            assert_eq!(verdict == Verdict::NoError, holds_true, "{line}: {verdict:?}");
        }
        assert!(claims(&plain("x = 5 and y = 2")).is_empty());
        // List markers, unknowns and numbers side by side are not computations to check.
        for prose in ["- 3 + 4 = 7", "2. 3 + 4 = 7", "3) 16 - 7 = 9"] {
            assert_eq!(first_wrong_arithmetic("3, 4, 16 and 7", prose), Verdict::NoError, "{prose}");
        }
        for unchecked in ["2x + 3 + 4 = 9", "3 + 4 = 7x", "In 2 3 + 4 = 9"] {
            assert!(claims(&plain(unchecked)).is_empty(), "{unchecked}");
        }
        assert!(claims(&plain("She has 16 eggs = a lot")).is_empty());
    }

    #[test]
    fn problem_words_and_conversions_are_known_values() {
        let known = problem_values("Twice a week she buys a dozen eggs and half a loaf for 25% off.");
        for v in [2.0, 12.0, 0.5, 25.0, 0.25] {
            assert!(is_known(v, &known), "{v}");
        }
        assert!(!is_known(13.0, &known));
        assert!(is_known(60.0, &[]) && is_known(7.0, &[]));
    }
}
