//! Equivalence of two parsed answers, following math-verify's `verify` semantics.
//!
//! Numbers: when either side is a bare decimal literal both are rounded to 6 decimal places
//! (`float_rounding = 6`); two bare integers compare their digits even if one carries `%`
//! (`9% == 9`); otherwise values are compared exactly (rationals) or to ~12 significant digits
//! (roots, `\pi`). Sets are unordered, tuples ordered, intervals need equal open/closed ends.
//! Knows nothing of text extraction or LaTeX.

use super::number::{Kind, Num};
use super::parse::Answer;

/// Decimal places used when a float literal is involved (math-verify's `float_rounding`).
pub const FLOAT_ROUNDING: u32 = 6;
/// Relative tolerance for inexact (irrational) values, ~ sympy `evalf(n=15)` with `chop`.
pub const REL_TOL: f64 = 1e-12;

/// Is `pred` equivalent to `gold`? (Not symmetric: gold decides how tuples/sets are read.)
pub fn answers_match(gold: &Answer, pred: &Answer) -> bool {
    match (gold, pred) {
        (Answer::Number(g), Answer::Number(p)) => numbers_match(g, p),
        (
            Answer::Interval {
                lo: gl,
                hi: gh,
                left_open: glo,
                right_open: gro,
            },
            Answer::Interval {
                lo: pl,
                hi: ph,
                left_open: plo,
                right_open: pro,
            },
        ) => glo == plo && gro == pro && numbers_match(gl, pl) && numbers_match(gh, ph),
        // An open interval `(a, b)` also reads as the pair (a, b).
        (
            Answer::Interval {
                lo,
                hi,
                left_open: true,
                right_open: true,
            },
            Answer::Tuple(items) | Answer::Set(items),
        ) if items.len() == 2 => {
            let pair = [Answer::Number(*lo), Answer::Number(*hi)];
            all_match(&pair, items)
        }
        (
            Answer::Tuple(items) | Answer::Set(items),
            Answer::Interval {
                lo,
                hi,
                left_open: true,
                right_open: true,
            },
        ) if items.len() == 2 => {
            let pair = [Answer::Number(*lo), Answer::Number(*hi)];
            if matches!(gold, Answer::Set(_)) {
                all_match(&sorted(items), &sorted(&pair))
            } else {
                all_match(items, &pair)
            }
        }
        (Answer::Relation { diff: g, strict: gs }, Answer::Relation { diff: p, strict: ps }) => {
            gs == ps && numbers_match(g, p)
        }
        (Answer::Tuple(g), Answer::Tuple(p)) => all_match(g, p),
        (Answer::Tuple(g), Answer::Set(p)) => all_match(g, &dedup(p)),
        (Answer::Set(g), Answer::Set(p) | Answer::Tuple(p)) => sets_match(g, p),
        (Answer::Number(_), Answer::Set(p)) => sets_match(std::slice::from_ref(gold), p),
        (Answer::Set(g), Answer::Number(_)) => sets_match(g, std::slice::from_ref(pred)),
        _ => false,
    }
}

fn all_match(g: &[Answer], p: &[Answer]) -> bool {
    g.len() == p.len() && g.iter().zip(p).all(|(a, b)| answers_match(a, b))
}

fn sets_match(g: &[Answer], p: &[Answer]) -> bool {
    let (g, p) = (dedup(g), dedup(p));
    if g.len() != p.len() {
        return false;
    }
    // Exact set equality first (order-free), then the element-wise sorted comparison.
    let exact = g.iter().all(|a| p.iter().any(|b| answers_match(a, b)))
        && p.iter().all(|b| g.iter().any(|a| answers_match(a, b)));
    exact || all_match(&sorted(&g), &sorted(&p))
}

fn sort_key(a: &Answer) -> f64 {
    match a {
        Answer::Number(n) => n.resolved().approx,
        Answer::Interval { lo, .. } => lo.approx,
        Answer::Tuple(v) | Answer::Set(v) => v.first().map_or(f64::NEG_INFINITY, sort_key),
        Answer::Relation { diff, .. } => diff.approx,
    }
}

fn sorted(items: &[Answer]) -> Vec<Answer> {
    let mut v = items.to_vec();
    v.sort_by(|a, b| sort_key(a).total_cmp(&sort_key(b)));
    v
}

/// Drop exact duplicates (a set `{1, 1, 2}` is `{1, 2}`), keeping written order.
fn dedup(items: &[Answer]) -> Vec<Answer> {
    let mut out: Vec<Answer> = Vec::with_capacity(items.len());
    for a in items {
        let dup = out.iter().any(|b| match (a, b) {
            (Answer::Number(x), Answer::Number(y)) => {
                let (x, y) = (x.resolved(), y.resolved());
                match (x.exact, y.exact) {
                    (Some(r), Some(s)) => r == s,
                    _ => x.approx == y.approx,
                }
            }
            _ => a == b,
        });
        if !dup {
            out.push(a.clone());
        }
    }
    out
}

/// math-verify's `sympy_numeric_eq` for scalars.
pub fn numbers_match(g: &Num, p: &Num) -> bool {
    let atomic = |n: &Num| n.kind != Kind::Expr;
    if atomic(g) || atomic(p) {
        if g.kind == Kind::Float || p.kind == Kind::Float {
            return rounded_eq(&g.resolved(), &p.resolved());
        }
        if g.kind == Kind::Integer && p.kind == Kind::Integer {
            // `9% == 9`: bare integers compare their digits, percent or not.
            return values_eq(
                &Num {
                    percent: false,
                    ..*g
                },
                &Num {
                    percent: false,
                    ..*p
                },
            );
        }
    }
    values_eq(&g.resolved(), &p.resolved())
}

fn values_eq(a: &Num, b: &Num) -> bool {
    let (a, b) = (a.resolved(), b.resolved());
    if let (Some(x), Some(y)) = (a.exact, b.exact) {
        return x == y;
    }
    approx_eq(a.approx, b.approx)
}

fn approx_eq(x: f64, y: f64) -> bool {
    if x.is_nan() || y.is_nan() {
        return false;
    }
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    (x - y).abs() <= REL_TOL * x.abs().max(y.abs()).max(1.0)
}

fn rounded_eq(a: &Num, b: &Num) -> bool {
    let scaled = |n: &Num| -> Option<i128> {
        match n.exact {
            Some(r) => r.round_scaled(FLOAT_ROUNDING),
            None => {
                let v = (n.approx * 10f64.powi(FLOAT_ROUNDING as i32)).round();
                (v.is_finite() && v.abs() < 1e30).then_some(v as i128)
            }
        }
    };
    match (scaled(a), scaled(b)) {
        (Some(x), Some(y)) => x == y,
        _ => approx_eq(a.approx, b.approx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::parse::parse_answer;

    fn m(g: &str, p: &str) -> bool {
        answers_match(&parse_answer(g).unwrap(), &parse_answer(p).unwrap())
    }

    #[test]
    fn floats_round_to_six_places() {
        assert!(m("\\frac{1}{3}", "0.333333"));
        assert!(!m("\\frac{1}{3}", "0.3333"));
        assert!(m("3.75", "3.7500001"));
        assert!(!m("3.75", "3.7501"));
        assert!(m("\\sqrt{2}", "1.414214"));
        assert!(!m("2\\pi", "6.28"));
    }

    #[test]
    fn exact_values() {
        assert!(m("3\\sqrt{2}", "\\sqrt{18}"));
        assert!(m("\\frac{2\\pi}{3}", "\\frac{2}{3}\\pi"));
        assert!(m("1024", "2^{10}"));
        assert!(!m("-5", "5"));
        assert!(!m("\\frac{3}{4}", "\\frac{4}{3}"));
    }

    #[test]
    fn percent_rules() {
        assert!(m("50%", "50"));
        assert!(m("50%", "0.5"));
        assert!(!m("50%", "50.0"));
        assert!(m("50%", "\\frac{1}{2}"));
        assert!(!m("12.5%", "12.5"));
    }

    #[test]
    fn intervals_tuples_sets() {
        assert!(m("[1, 5)", "[1,5)"));
        assert!(!m("[1, 5)", "(1, 5)"));
        assert!(!m("(1, 2)", "(2, 1)"));
        assert!(m("(1, 2)", "1, 2"));
        assert!(!m("(1, 2, 3)", "(3, 2, 1)"));
        assert!(m("\\{1, 2, 3\\}", "\\{3, 1, 2\\}"));
        assert!(!m("\\{1, 2, 3\\}", "\\{1, 2\\}"));
        assert!(m("(-\\infty, 3]", "(-\\infty,3]"));
    }
}
