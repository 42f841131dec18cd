//! Find the final answer in a model response.
//!
//! Produces candidate answer spans in math-verify's priority order: `\boxed{}`/`\fbox{}` and
//! "final answer ... is X" (50), "answer: X" (100), "answer ... X" (200), GSM8K `#### X` (250),
//! then any LaTeX environment (`$..$`, `$$..$$`, `\(..\)`, `\[..\]`, a bare `\frac{a}{b}`) or
//! plain number/expression (300). Within a priority the rightmost span comes first; the caller
//! takes the first candidate that parses. Knows nothing of number semantics.

/// One possible answer span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Lower is preferred.
    pub priority: u16,
    /// Byte offsets of the whole match in the response (for ordering).
    pub start: usize,
    pub end: usize,
    /// The answer text, still LaTeX (boxes unwrapped).
    pub text: String,
    /// Plain-text number or expression (not LaTeX).
    pub plain: bool,
}

const CURRENCY: &str = "$€£¥₹₽₪₩₫฿";

/// Content of the last `\boxed{...}` or `\fbox{...}` (nested braces balanced; an unclosed box
/// runs to the end of the text).
pub fn last_boxed(text: &str) -> Option<&str> {
    let b = text.rfind("\\boxed");
    let f = text.rfind("\\fbox");
    let (start, len) = match (b, f) {
        (Some(b), Some(f)) if f > b => (f, 5),
        (Some(b), _) => (b, 6),
        (None, Some(f)) => (f, 5),
        (None, None) => return None,
    };
    let rest = text[start + len..].trim_start();
    let open = text.len() - rest.len();
    if !rest.starts_with('{') {
        return if rest.is_empty() { None } else { Some(rest) };
    }
    let close = super::normalize::closing_brace(text[open..].char_indices()).map_or(text.len(), |i| open + i);
    Some(text[open + 1..close].trim())
}

/// The answer of the last `\boxed{}`/`\fbox{}` and of the boxes just before it that belong to
/// it, joined by commas, with the byte span from the first joined box to the end of the last
/// (math-verify's `extract_boxed_content(mode="last")`): walking back from the last box, an
/// earlier box joins when fewer than 10 characters separate the two, or fewer than 70 holding
/// "and", "or", `,` or `;` and the two contents differ (`\boxed{1}, \boxed{2}`, `y_1 =
/// \boxed{A} \) and \( y_2 = \boxed{B}`). A box inside another (`\boxed{\boxed{7}}`) gives its
/// inner content; an unclosed last box runs to the end of the text. When the last box lies in a
/// LaTeX environment, the answer is every box of that environment and of the environments joined
/// to it by "and", "or" or `,` (`$\boxed{1}$ but then $\boxed{2}$` gives 2; `\(\boxed{1}\) and
/// \(\boxed{-2}\)` gives 1,-2).
pub fn boxed_group_span(text: &str) -> Option<(String, usize, usize)> {
    let Some(last) = text.rfind("\\boxed") else {
        return boxed_walk(text, false);
    };
    // The LaTeX environments (`$..$`, `\[..\]`, ...), not bare `\frac` spans.
    let envs: Vec<(usize, usize)> = latex_envs(text, 0)
        .into_iter()
        .filter(|c| {
            text[c.start..].starts_with(['$', '\\']) && !text[c.start..].starts_with("\\frac")
        })
        .map(|c| (c.start, c.end))
        .collect();
    let boxed_env = |&(s, e): &(usize, usize)| text[s..e].contains("\\boxed{");
    // math-verify's environment match ends after its closing delimiter, its bare `\boxed{.+}`
    // match at the last `}`: the later end is read.
    let plain_end = text.rfind('}').map_or(0, |i| i + 1);
    if let Some(k) = envs
        .iter()
        .position(|&(s, e)| s <= last && last < e && e > plain_end)
    {
        // Environments holding boxes joined by "and", "or" or `,` are one answer (at most 6,
        // grouped from the left as math-verify's regex matches them).
        let mut first = k;
        while first > 0
            && boxed_env(&envs[first - 1])
            && is_env_joiner(&text[envs[first - 1].1..envs[first].0])
        {
            first -= 1;
        }
        let first = first + (k - first) / 6 * 6;
        let parts: Vec<String> = envs[first..=k]
            .iter()
            .filter_map(|&(s, e)| boxed_walk(&text[s..e], true).map(|g| g.0))
            .collect();
        return Some((parts.join(","), envs[first].0, envs[k].1));
    }
    boxed_walk(text, false)
}

/// `\s*(,?and|,?or|,)\s*` between two LaTeX environments (math-verify's joiner).
fn is_env_joiner(gap: &str) -> bool {
    matches!(gap.trim(), "," | "and" | "or" | ",and" | ",or")
}

/// math-verify's `extract_boxed_content`: the boxes walking back from the last one, all of them
/// (`all`, inside one environment) or those that join by the rule of [`boxed_group_span`].
fn boxed_walk(text: &str, all: bool) -> Option<(String, usize, usize)> {
    let mut parts: Vec<&str> = Vec::new();
    let mut limit = text.len();
    let mut max_pos = text.len();
    let mut later_start: Option<usize> = None;
    let mut first_start = 0;
    let mut end = text.len();
    loop {
        let b = text[..limit].rfind("\\boxed");
        let f = text[..limit].rfind("\\fbox");
        let (start, len) = match (b, f) {
            (Some(b), Some(f)) if f > b => (f, 5),
            (Some(b), _) => (b, 6),
            (None, Some(f)) => (f, 5),
            (None, None) => break,
        };
        let rest = text[start + len..max_pos].trim_start();
        let open = max_pos - rest.len();
        if rest.is_empty() {
            break;
        }
        if !rest.starts_with('{') {
            if parts.is_empty() {
                parts.push(text[open..].trim());
                first_start = start;
            }
            break;
        }
        let close = super::normalize::closing_brace(text[open..max_pos].char_indices()).map(|i| open + i);
        let Some(close) = close else {
            if parts.is_empty() {
                parts.push(text[open + 1..].trim());
                first_start = start;
            }
            break;
        };
        let content = text[open + 1..close].trim();
        if let (Some(next), false) = (later_start, all) {
            let between = &text[close + 1..next];
            let n = between.chars().count();
            let joins =
                n < 10 || (parts.last() != Some(&content) && n < 70 && has_list_separator(between));
            if !joins {
                break;
            }
        }
        if later_start.is_none() {
            end = close + 1;
        }
        if parts.last() != Some(&content) {
            parts.push(content);
        }
        first_start = start;
        later_start = Some(start);
        max_pos = start;
        limit = start;
    }
    if parts.is_empty() {
        return None;
    }
    parts.reverse();
    Some((parts.join(","), first_start, end))
}

/// [`boxed_group_span`]'s answer text.
pub fn boxed_group(text: &str) -> Option<String> {
    boxed_group_span(text).map(|g| g.0)
}

/// "and" or "or" as a word, or a `,` or `;` (math-verify's separator between boxes).
fn has_list_separator(s: &str) -> bool {
    if s.contains([',', ';']) {
        return true;
    }
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    ["and", "or"].iter().any(|w| {
        s.match_indices(w).any(|(i, _)| {
            (i == 0 || !word(b[i - 1])) && b.get(i + w.len()).is_none_or(|&c| !word(c))
        })
    })
}

/// The best answer string in `response`, if any (the first candidate; see [`candidates`]).
pub fn extract_answer(response: &str) -> Option<String> {
    candidates(response).into_iter().next().map(|c| c.text)
}

/// Priority of "final answer … is X" (math-verify's 50, as a `\boxed{}`).
const FINAL_ANSWER: u16 = 50;

/// All candidate spans, best first.
pub fn candidates(response: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    // Like math-verify, a bare `\fbox` only counts inside a LaTeX environment, and an empty box
    // ("… within \boxed{}." from a model echoing its instruction) is no answer.
    // Several boxes close together are one answer (see [`boxed_group_span`]).
    if let Some((inner, _, end)) = boxed_group_span(response)
        .filter(|(inner, _, _)| response.contains("\\boxed") && !inner.is_empty())
    {
        out.push(Candidate {
            priority: 50,
            start: 0,
            end,
            text: inner,
            plain: false,
        });
    }
    let lower = response.to_ascii_lowercase();
    // "final answer ... is X"
    for (i, _) in lower.match_indices("final answer") {
        let window_end = floor_char(response, (i + 12 + 100).min(response.len()));
        if let Some(j) = lower[i + 12..window_end].find(" is") {
            let after = i + 12 + j + 3;
            let rest = &response[after..];
            let rest_trim = rest.strip_prefix(':').unwrap_or(rest);
            let off = response.len() - rest_trim.len();
            // The answer follows "is" after whitespace only (math-verify: `is:?\s*` then the span).
            let gap = rest_trim.len() - rest_trim.trim_start().len();
            out.extend(first_answer_at(response, off, FINAL_ANSWER, gap));
        }
    }
    // "answer: X" and "answer ... X"
    for (i, _) in lower.match_indices("answer") {
        let after = i + 6;
        let colon = response[after..].starts_with(':');
        let prio = if colon { 100 } else { 200 };
        let from = if colon { after + 1 } else { after };
        out.extend(first_answer_at(response, from, prio, 50));
    }
    // GSM8K "#### X"
    if let Some(i) = response.rfind("####") {
        out.extend(first_answer_at(response, i + 4, 250, 5));
    }
    // Anything; a plain-text answer after the last "is"/"are" of the final sentence ("so the
    // range is [-1, 1].") is tried before the numbers inside it.
    let last = final_sentence(response);
    let last_off = last.as_ptr() as usize - response.as_ptr() as usize;
    if let Some(i) = [" is ", " are "]
        .iter()
        .filter_map(|w| last.rfind(w).map(|i| i + w.len()))
        .max()
    {
        out.extend(sentence_answer(response, last_off + i, 300));
    }
    out.extend(align_row_tail(response, 300));
    out.extend(latex_envs(response, 300));
    out.extend(plain_numbers(response, 300));
    out.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.end.cmp(&a.end))
            .then(a.start.cmp(&b.start))
    });
    out
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Candidates anchored at `from` (just after "answer", "is", `####`): the first LaTeX
/// environment starting within `window` bytes, and the plain number/expression either right after
/// the last `=` within 100 bytes on the same line (`answer: x = 2y, so x = 6` gives 6) or else
/// the first one starting within `window` bytes (several when an expression and a number start
/// at the same place). The caller orders them by position, as math-verify does.
fn first_answer_at(text: &str, from: usize, priority: u16, window: usize) -> Vec<Candidate> {
    // Bound the scanned tail so that a response with many "answer" words stays linear.
    let stop = floor_char(text, (from + window + 4096).min(text.len()));
    let tail = &text[from..stop];
    let limit = from + window.min(tail.len());
    let latex = latex_envs(tail, priority)
        .into_iter()
        .map(|c| shift(c, from))
        .filter(|c| c.start <= limit)
        .min_by_key(|c| c.start);
    let plain: Vec<Candidate> = plain_numbers(tail, priority)
        .into_iter()
        .map(|c| shift(c, from))
        .filter(|c| !text[from..c.start].contains('\n'))
        .collect();
    let line_end = tail.find('\n').map_or(stop, |i| from + i);
    let eq_stop = floor_char(text, (from + 101).min(line_end));
    // "final answer is $12$ + 1 = 13" answers 12: math-verify looks past a later `=` only after
    // "answer" (its `answer.{0,100}=` patterns), not after "final answer … is".
    let last_eq = (priority != FINAL_ANSWER)
        .then(|| text[from..eq_stop].rfind('=').map(|i| from + i))
        .flatten();
    let followed_by_eq = |c: &Candidate| text[c.end..].trim_start().starts_with('=');
    let after_eq: Vec<Candidate> = match last_eq {
        Some(eq) => plain
            .iter()
            .filter(|c| {
                c.start >= eq && text[eq + 1..c.start].trim().is_empty() && !followed_by_eq(c)
            })
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    let chosen = if after_eq.is_empty() {
        let first = plain
            .iter()
            .filter(|c| c.start <= limit && !followed_by_eq(c))
            .map(|c| c.start)
            .min();
        plain
            .into_iter()
            .filter(|c| Some(c.start) == first)
            .collect()
    } else {
        after_eq
    };
    // GSM8K's `#### N` is one number, as math-verify reads it.
    let sentence = (priority != 250)
        .then(|| sentence_answer(text, from, priority))
        .flatten();
    latex.into_iter().chain(chosen).chain(sentence).collect()
}

/// The right-hand side of a response that ends on a row of an `align` environment (`&= 6p^4 +
/// 5p^2 - 4.` or `&= \sin 3x.\end{align*}`), read whole: it ends after the numbers inside it, so
/// it is tried first. math-verify finds no LaTeX outside `$..$`/`\[..\]` and reads the last
/// number (4, 3); this is a deliberate difference (README, data/real-answers/README.md).
fn align_row_tail(text: &str, priority: u16) -> Option<Candidate> {
    let mut t = text.trim_end();
    loop {
        let before = t.len();
        for end in ["\\end{align*}", "\\end{align}", "\\]", "$$"] {
            t = t.strip_suffix(end).unwrap_or(t).trim_end();
        }
        if t.len() == before {
            break;
        }
    }
    let line_start = t.rfind('\n').map_or(0, |i| i + 1);
    // `&=`, also with spacing between (`&\qquad=`); the `=` is the last of the row's relations.
    let eq = t[line_start..].match_indices('&').map(|(i, _)| line_start + i).rev().find_map(|i| {
        let mut rest = &t[i + 1..];
        loop {
            let skipped = rest.trim_start();
            match ["\\qquad", "\\quad", "\\;", "\\,", "\\:", "\\!"].iter().find_map(|sp| skipped.strip_prefix(sp)) {
                Some(r) => rest = r,
                None => return skipped.starts_with('=').then(|| t.len() - skipped.len()),
            }
        }
    })?;
    // A row's last column may be a comment (`&=6&\text{added 1}.`).
    let row = &t[eq + 1..];
    let row = &row[..column_end(row)];
    let body = row.trim().trim_end_matches(['.', ',']).trim_end();
    // A row written the other way round (`\frac{4}{13} &= y`) ends on its variable.
    let lone_variable = body.len() == 1 && body.bytes().all(|c| c.is_ascii_alphabetic());
    if body.is_empty() || body.len() > 120 || body.contains('$') || lone_variable {
        return None;
    }
    let start = eq + 1 + (t[eq + 1..].len() - t[eq + 1..].trim_start().len());
    Some(Candidate {
        priority,
        start,
        end: text.len(),
        text: body.to_string(),
        plain: false,
    })
}

/// Where the first column of an `align` row's rest ends: at its first `&` outside braces and
/// environments (a matrix's `&` stays), else at its end.
fn column_end(row: &str) -> usize {
    let (mut depth, mut envs) = (0usize, 0usize);
    for (i, c) in row.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            '\\' if row[i..].starts_with("\\begin{") => envs += 1,
            '\\' if row[i..].starts_with("\\end{") => envs = envs.saturating_sub(1),
            '&' if depth == 0 && envs == 0 => return i,
            _ => {}
        }
    }
    row.len()
}

/// The rest of the sentence after an answer marker, when it is a plain-text answer: `is
/// 2^(n-1).`, `is [-1, 1].`, `is 1, 4 and 9.`, `is sqrt(3)`. It ends later than the numbers inside
/// it, so it is tried first; a sentence that goes on in words (`is 5 because ...`) is no answer
/// and the numbers are tried instead. Plain text only: LaTeX has its own spans (environments),
/// and math-verify reads no bare LaTeX outside them.
fn sentence_answer(text: &str, from: usize, priority: u16) -> Option<Candidate> {
    // A sentence is short: bound the scan so that many "answer" words stay linear.
    let mut r = &text[from..floor_char(text, (from + 400).min(text.len()))];
    loop {
        // On the marker's line: "is:\n\n1. First …" starts a list, not an answer.
        let t = r.trim_start_matches([' ', '\t']);
        let next = ["is ", "=", ":", "equals ", "equal to ", "be "]
            .iter()
            .find_map(|p| t.strip_prefix(p));
        match next {
            Some(rest) => r = rest,
            None => {
                r = t;
                break;
            }
        }
    }
    let start = r.as_ptr() as usize - text.as_ptr() as usize;
    let mut end = r.find('\n').unwrap_or(r.len());
    if let Some(i) = r[..end].find(". ") {
        end = i;
    }
    let body = r[..end]
        .trim_end()
        .trim_end_matches(['.', ',', ';', '!'])
        .trim_end();
    // A ratio `42:42` is read in LaTeX only; in plain text math-verify reads its first number.
    if body.is_empty()
        || body.len() > 80
        || body.contains(['$', '\\', ':'])
        || !body
            .chars()
            .any(|c| c.is_ascii_digit() || c.is_alphabetic())
        || !only_math_words(body)
    {
        return None;
    }
    Some(Candidate {
        priority,
        start,
        end: start + body.len(),
        text: body.to_string(),
        plain: true,
    })
}

/// Words that may stand in a plain-text answer: function names, `pi`, list words.
pub(crate) const MATH_WORDS: &[&str] = &[
    "sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "ln", "log",
    "exp", "pi", "and", "or", "infinity",
];

/// Every word of `s` is a single letter (a variable), a function name or a list word: `2^(n-1)`, `sqrt(3)`, `1, 4 and 9` are; `5 because 2+3 = 5` is not.
fn only_math_words(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() {
            let start = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i - start > 1 && !MATH_WORDS.contains(&&s[start..i]) {
                return false;
            }
        } else {
            i += 1;
        }
    }
    true
}

/// The last sentence of a text: its last non-empty line, from after the last `. ` in it.
pub fn final_sentence(text: &str) -> &str {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(&text[text.len()..]);
    let line = line.trim_end().trim_end_matches('.');
    match line.rfind(". ") {
        Some(i) => &line[i + 2..],
        None => line,
    }
}

fn shift(mut c: Candidate, by: usize) -> Candidate {
    c.start += by;
    c.end += by;
    c
}

/// `$..$`, `$$..$$`, `\(..\)`, `\[..\]` and bare `\frac{a}{b}` spans.
fn latex_envs(text: &str, priority: u16) -> Vec<Candidate> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        let (open_len, close): (usize, &str) = if b[i] == b'$' && !escaped {
            if b.get(i + 1) == Some(&b'$') {
                (2, "$$")
            } else if i > 0 && b[i - 1].is_ascii_digit() {
                i += 1;
                continue;
            } else {
                (1, "$")
            }
        } else if b[i] == b'\\' && !escaped && matches!(b.get(i + 1), Some(b'(') | Some(b'[')) {
            (2, if b[i + 1] == b'(' { "\\)" } else { "\\]" })
        } else if b[i..].starts_with(b"\\frac{") && !escaped {
            if let Some(end) = simple_frac_end(text, i) {
                let start = if i > 0 && b[i - 1] == b'-' { i - 1 } else { i };
                out.push(Candidate {
                    priority,
                    start,
                    end,
                    text: text[start..end].to_string(),
                    plain: false,
                });
                i = end;
            } else {
                i += 1;
            }
            continue;
        } else {
            i += 1;
            continue;
        };
        let body_start = i + open_len;
        let mut j = body_start;
        let mut found = None;
        while j < b.len() {
            if close == "$" && b[j] == b'\n' {
                break;
            }
            if b[j] == b'\\' && close == "$" && b.get(j + 1) == Some(&b'$') {
                j += 2;
                continue;
            }
            if b[j..].starts_with(close.as_bytes())
                && (close != "$" || b[j - 1] != b'\\')
                && j > body_start
            {
                found = Some(j);
                break;
            }
            j += 1;
        }
        match found {
            Some(j) => {
                let body = &text[body_start..j];
                let mut end = j + close.len();
                let mut body = unbox_all(body);
                // A percent sign right after the environment belongs to it.
                let rest = &text[end..];
                let rest_t = rest.trim_start();
                for p in ["\\%", "%"] {
                    if rest_t.starts_with(p) {
                        body.push('%');
                        end += rest.len() - rest_t.len() + p.len();
                        break;
                    }
                }
                out.push(Candidate {
                    priority,
                    start: i,
                    end,
                    text: body,
                    plain: false,
                });
                i = end;
            }
            None => i += open_len,
        }
    }
    out
}

/// End of `\frac{num}{num}` at `i`, numbers being `-?\d+([.,]\d+)?`.
fn simple_frac_end(text: &str, i: usize) -> Option<usize> {
    let mut j = i + "\\frac".len();
    for _ in 0..2 {
        let rest = text.get(j..)?;
        let inner = rest.strip_prefix('{')?;
        let close = inner.find('}')?;
        let num = &inner[..close];
        let num = num.strip_prefix('-').unwrap_or(num);
        if num.is_empty()
            || !num
                .bytes()
                .all(|c| c.is_ascii_digit() || c == b'.' || c == b',')
        {
            return None;
        }
        j += close + 2;
    }
    Some(j)
}

/// Replace every `\boxed{..}` by its content (joined by commas when several), else the text.
fn unbox_all(body: &str) -> String {
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(inner) = last_boxed(rest) {
        if parts.last().map(String::as_str) != Some(inner) {
            parts.push(inner.to_string());
        }
        let cut = rest
            .rfind("\\boxed")
            .into_iter()
            .chain(rest.rfind("\\fbox"))
            .max();
        match cut {
            Some(c) => rest = &rest[..c],
            None => break,
        }
    }
    if parts.is_empty() {
        body.to_string()
    } else {
        parts.reverse();
        parts.join(",")
    }
}

fn is_expr_char(c: char) -> bool {
    c.is_ascii_digit() || c.is_whitespace() || "+-*×/^()÷.".contains(c)
}

/// Plain numbers (`1,234.5`, `.5`, `3%`) and simple expressions (`7/2`, `3 + 4`) preceded by the
/// start, whitespace or `=` (optionally `**` and a currency sign), like math-verify's expr regex.
fn plain_numbers(text: &str, priority: u16) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut last_end = 0;
    let mut no_expr_until = 0;
    while i < text.len() {
        if !text.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let at_start = i == 0;
        let prev = text[..i].chars().last();
        let prefix_ok = at_start || prev.is_some_and(|c| c.is_whitespace() || c == '=');
        if !prefix_ok || i < last_end {
            i += 1;
            continue;
        }
        let mut k = i;
        if text[k..].starts_with("**") {
            k += 2;
        }
        let start = i;
        let expr = if k < no_expr_until {
            None
        } else {
            match expr_at(text, k) {
                Ok(e) => Some(e),
                Err(run_end) => {
                    // No later start inside this run can hold an operator either.
                    no_expr_until = run_end;
                    None
                }
            }
        };
        if let Some((text_s, end)) = &expr {
            out.push(Candidate {
                priority,
                start,
                end: *end,
                text: text_s.clone(),
                plain: true,
            });
        }
        if let Some(c) = text[k..].chars().next() {
            if CURRENCY.contains(c) {
                k += c.len_utf8();
            }
        }
        // The number at the same place is the fallback when the expression does not parse
        // (`**3**.` is not an expression, `3` is).
        if let Some((num, end)) = number_at(text, k) {
            let expr_end = expr.as_ref().map_or(0, |e| e.1);
            out.push(Candidate {
                priority,
                start,
                end,
                text: num,
                plain: true,
            });
            last_end = end.max(expr_end);
            i = last_end;
            continue;
        }
        if let Some((_, end)) = expr {
            last_end = end;
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

/// An expression with at least one operator, starting with a digit (after `-`/`(`), ending
/// before a suffix (`.`, `,`, `:`, whitespace, `)`, `$`, end).
///
/// `Err(run_end)` (an absolute offset) when no expression starts here or anywhere later in the
/// same run of expression characters.
fn expr_at(text: &str, k: usize) -> Result<(String, usize), usize> {
    let rest = &text[k..];
    let mut lead = 0;
    for p in ["-", "(", "-"] {
        if rest[lead..].starts_with(p) {
            lead += 1;
        }
    }
    if !rest[lead..].starts_with(|c: char| c.is_ascii_digit()) {
        return Err(k);
    }
    let run_len: usize = rest[lead..]
        .chars()
        .take_while(|&c| is_expr_char(c) && c != '\n')
        .map(char::len_utf8)
        .sum();
    let run = &rest[..lead + run_len];
    // The first operator (after the leading digit) decides which prefixes qualify: it must be
    // followed by at least one more character. Linear in the run length.
    let first_op_end = run[lead..]
        .char_indices()
        .skip(1)
        .find(|&(_, c)| "+-*×/^()÷".contains(c))
        .map(|(i, c)| lead + i + c.len_utf8())
        .ok_or(k + run.len())?;
    // Longest prefix ending before a valid suffix.
    let mut e = run.len();
    while e > first_op_end {
        if run.is_char_boundary(e) {
            let next = text[k + e..].chars().next();
            let suffix_ok = next.is_none_or(|c| ".,:)$".contains(c) || c.is_whitespace())
                || text[k + e..].starts_with("**");
            if suffix_ok {
                let trimmed = run[..e].trim_end();
                return Ok((trimmed.replace("**", "^"), k + trimmed.len()));
            }
        }
        e -= 1;
    }
    Err(k)
}

/// A number at `k`: thousands-separated, decimal (`.` or `,`), `.5`, or integer, with an
/// optional percent suffix. Returns the canonical text and the end offset.
fn number_at(text: &str, k: usize) -> Option<(String, usize)> {
    let b = text.as_bytes();
    let mut j = k;
    let neg = b.get(j) == Some(&b'-');
    if neg {
        j += 1;
    }
    let digits = |mut p: usize| {
        while p < b.len() && b[p].is_ascii_digit() {
            p += 1;
        }
        p
    };
    let int_end = digits(j);
    let mut number = String::new();
    let end;
    if int_end == j {
        // `.5`
        if !neg && b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit) {
            end = digits(j + 1);
            number = format!("0{}", &text[j..end]);
        } else {
            return None;
        }
    } else {
        // Thousands groups: [1-9]\d{0,2}([ ,]\d{3})+ (\.\d+)?
        let mut g_end = int_end;
        let lead_ok = b[j] != b'0' && int_end - j <= 3;
        let mut groups = 0;
        if lead_ok {
            while g_end + 3 < b.len() + 1
                && matches!(b.get(g_end), Some(b' ') | Some(b','))
                && b.get(g_end + 1..g_end + 4)
                    .is_some_and(|g| g.iter().all(u8::is_ascii_digit))
            {
                g_end += 4;
                groups += 1;
            }
        }
        if groups > 0 {
            let mut e = g_end;
            if b.get(e) == Some(&b'.') && b.get(e + 1).is_some_and(u8::is_ascii_digit) {
                e = digits(e + 1);
            }
            number = text[j..e].replace([' ', ','], "");
            end = e;
        } else if matches!(b.get(int_end), Some(b'.') | Some(b','))
            && b.get(int_end + 1).is_some_and(u8::is_ascii_digit)
        {
            end = digits(int_end + 1);
            number = format!("{}.{}", &text[j..int_end], &text[int_end + 1..end]);
        } else {
            end = int_end;
            number.push_str(&text[j..int_end]);
        }
        let trimmed = number.trim_start_matches('0');
        number = if trimmed.is_empty() || trimmed.starts_with('.') {
            format!("0{trimmed}")
        } else {
            trimmed.to_string()
        };
    }
    if neg {
        number.insert(0, '-');
    }
    // Percent suffix.
    let rest = &text[end..];
    let rest_t = rest.trim_start();
    for p in [
        "%",
        "percentage",
        "Percentage",
        "percent",
        "Percent",
        "pct",
        "Pct",
    ] {
        if rest_t.starts_with(p) {
            number.push('%');
            return Some((number, end + (rest.len() - rest_t.len()) + p.len()));
        }
    }
    Some((number, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_with_nested_braces() {
        assert_eq!(
            last_boxed("so \\boxed{\\frac{1}{2}} ok"),
            Some("\\frac{1}{2}")
        );
        assert_eq!(last_boxed("\\boxed{1} then \\fbox{2}"), Some("2"));
        assert_eq!(last_boxed("\\boxed{\\boxed{7}}"), Some("7"));
        assert_eq!(last_boxed("no box"), None);
    }

    #[test]
    fn answer_forms() {
        assert_eq!(
            extract_answer("The answer is 1,234.").as_deref(),
            Some("1234")
        );
        assert_eq!(
            extract_answer("We try 9 first.\n#### 42").as_deref(),
            Some("42")
        );
        assert_eq!(
            extract_answer("Final answer: $\\frac{1}{2}$").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(
            extract_answer("I computed 5 earlier, but the answer is 7.").as_deref(),
            Some("7")
        );
        assert_eq!(
            extract_answer("Total: 3 + 4 = 7 apples").as_deref(),
            Some("7")
        );
        assert_eq!(
            extract_answer("Thus $x = 3$ and \\boxed{4}").as_deref(),
            Some("4")
        );
        assert_eq!(extract_answer("It is 25 percent.").as_deref(), Some("25%"));
        // Like math-verify, the trailing full stop is part of the greedy expression match.
        assert_eq!(
            extract_answer("The answer is 7/2.").as_deref(),
            Some("7/2.")
        );
        assert_eq!(
            extract_answer("The answer: x = 2y, so x = 6 in the end").as_deref(),
            Some("6")
        );
        assert_eq!(extract_answer("nothing here"), None);
    }
}
