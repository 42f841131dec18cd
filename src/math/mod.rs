//! Math answer verifier for RL with verifiable rewards: is a model's final answer equal to the
//! reference answer?
//!
//! Pure Rust, no libtorch. Mirrors the semantics of PyPI `math-verify` 0.9.0 (`parse` + `verify`)
//! for the common answer shapes; `tests/verifier_parity.rs` measures the agreement.
//!
//! - [`extract`]: find the final answer in a response (`\boxed{}`, "answer is", `####`, last number)
//! - [`normalize`]: LaTeX clean-up (spacing, `\left`, units, `\text{}`, `^\circ`, `\$`, percent words)
//! - [`parse`]: answer string -> [`Answer`] (numbers, intervals, tuples, sets), exact arithmetic
//! - [`compare`]: equivalence rules (6-decimal rounding against float literals, percent rules)
//! - [`number`]: exact rationals with an `f64` shadow
//!
//! Knows nothing of prompts, models or stages.

pub mod compare;
pub mod extract;
pub mod normalize;
pub mod number;
pub mod parse;

pub use compare::answers_match;
pub use extract::extract_answer;
pub use parse::{parse_answer, Answer, ParseError};

/// The verifier's judgement on one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The answer text taken from the response (before normalization), if any.
    pub extracted: Option<String>,
    /// Whether it matches the gold answer.
    pub correct: bool,
}

/// Parse an answer string (gold, or an already-extracted prediction): unwrap a `\boxed{}`,
/// normalize, parse.
pub fn parse_gold(answer: &str) -> Result<Answer, ParseError> {
    let inner = extract::last_boxed(answer).unwrap_or(answer);
    parse::parse_answer(&normalize::normalize(inner))
}

/// Normalized string form, used when an answer does not parse as a number/interval/tuple/set.
fn text_form(answer: &str) -> String {
    normalize::normalize(answer)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

/// Compare two answer strings (no extraction): `verify("\\frac{1}{2}", "0.5") == true`.
/// Unparseable answers fall back to normalized string equality.
pub fn verify(gold: &str, prediction: &str) -> bool {
    match (parse_gold(gold), parse_gold(prediction)) {
        (Ok(g), Ok(p)) => answers_match(&g, &p),
        (Err(_), Err(_)) => {
            let (g, p) = (text_form(gold), text_form(prediction));
            !g.is_empty() && g == p
        }
        _ => false,
    }
}

/// Extract the final answer from `response` and compare it with `gold_answer`.
///
/// Candidates are tried best first (see [`extract::candidates`]); the first that parses is the
/// prediction. If none parses, the first candidate is compared as text.
pub fn verify_response(gold_answer: &str, response: &str) -> Verdict {
    let candidates = extract::candidates(response);
    let gold = parse_gold(gold_answer);
    let Some(best_priority) = candidates.first().map(|c| c.priority) else {
        return Verdict {
            extracted: None,
            correct: false,
        };
    };
    // Like math-verify: only the best priority group that yields a parse is used.
    let mut chosen = None;
    for prio in candidates.iter().map(|c| c.priority) {
        if let Some((c, a)) = candidates
            .iter()
            .filter(|c| c.priority == prio)
            .find_map(|c| {
                parse_answer(&normalize::normalize(&c.text))
                    .ok()
                    .map(|a| (c, a))
            })
        {
            chosen = Some((c.text.clone(), a));
            break;
        }
    }
    match (chosen, gold) {
        (Some((text, pred)), Ok(g)) => Verdict {
            correct: answers_match(&g, &pred),
            extracted: Some(text),
        },
        (Some((text, _)), Err(_)) => Verdict {
            correct: false,
            extracted: Some(text),
        },
        (None, _) => {
            let first = candidates
                .iter()
                .find(|c| c.priority == best_priority)
                .map(|c| c.text.clone())
                .unwrap_or_default();
            let g = text_form(gold_answer);
            Verdict {
                correct: !g.is_empty() && g == text_form(&first),
                extracted: Some(first),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_compares_answer_strings() {
        assert!(verify("\\frac{1}{2}", "0.5"));
        assert!(verify("\\boxed{12}", "12 \\text{ cm}"));
        assert!(!verify("12", "13"));
        assert!(verify("\\text{Monday}", "monday"));
        assert!(!verify("", ""));
    }

    #[test]
    fn verify_response_extracts_then_compares() {
        let v = verify_response("42", "We try 40 first. The answer is $\\boxed{42}$.");
        assert_eq!(v.extracted.as_deref(), Some("42"));
        assert!(v.correct);
        let v = verify_response("\\frac{3}{4}", "#### 0.75");
        assert!(v.correct);
        let v = verify_response("7", "no numbers here");
        assert_eq!(
            v,
            Verdict {
                extracted: None,
                correct: false
            }
        );
        assert!(!verify_response("-5", "The answer is 5.").correct);
    }
}
