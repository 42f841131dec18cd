//! Where a completion's chain of thought ends, and what credit assignment does with the rest.
//!
//! The paper's MDP is "segments of the chain of thought, then the answer y": a reasoning model
//! (DeepSeek-R1-Distill, Qwen3 in thinking mode, this project's default world) writes
//! `<think> … </think>` and then its answer. The `rollout` stage records `cot_end` (exclusive, in
//! completion tokens): the index after the end-of-thinking token, or, for a model without one, the
//! first token of the sentence (within its line) holding the verifier's extracted answer
//! ([`answer_start`]). Segmentation and every credit method cover `0..cot_end` only; y* is scored
//! right after it; answers are extracted only from the tokens after it. `cot_end = 0` (the answer
//! sentence starts the completion) is an empty chain of thought: no segments, and the update gives
//! it GRPO's uniform credit.
//!
//! A trace whose thinking never closes (cut by the token budget, or no answer line) has no
//! `cot_end`; the `on_unclosed` param ([`OnUnclosed`]) says what credit assignment does with it.
//! Knows nothing of tokenizers: callers map text offsets to tokens.

use serde::Deserialize;

/// The end-of-thinking marker of R1-distill, Qwen3 and the default world's tokenizer.
pub const THINK_CLOSE: &str = "</think>";
/// The opening marker (Qwen3 and the default world write it; R1-distill's prompt ends with it).
pub const THINK_OPEN: &str = "<think>";

/// What credit assignment does with a trace whose chain of thought never ended (stage param
/// `on_unclosed`). Always counted (`thinking_unclosed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnclosed {
    /// The whole completion is the chain of thought (cut where the budget ran out); y* is scored
    /// after it, without an end-of-thinking token.
    Truncate,
    /// No segments and no credit scores; the update trains it with uniform (GRPO) token weights.
    Skip,
    /// Stop, naming the row.
    Error,
}

/// Index after the first `think_end` token in `ids`, if any.
pub fn closed_at(ids: &[i64], think_end: i64) -> Option<usize> {
    ids.iter().position(|&t| t == think_end).map(|i| i + 1)
}

/// Byte offset in `text` where the answer y starts, for models without an end-of-thinking token:
/// the start of the sentence holding the verifier's extracted answer `extracted` (the first
/// extraction candidate with that text; see [`crate::math::extract`]), within the line holding
/// the match's end. Sentences, not lines: SmolLM2 wrote the answer in the last sentence of a
/// line of reasoning in 28 of 128 GSM8K rollouts ("… = 0.167. So, the probability is …"), 6 of
/// them the whole completion in one line, which a line rule credited as all answer.
pub fn answer_start(text: &str, extracted: &str) -> Option<usize> {
    let c = crate::math::extract::candidates(text)
        .into_iter()
        .find(|c| c.text == extracted)?;
    // The line holding the match's last byte: a `\boxed{}` candidate's span may start earlier.
    let last = c.end.saturating_sub(1).max(c.start).min(text.len());
    let last = (0..=last).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let line = text[..last].rfind('\n').map_or(0, |i| i + 1);
    // Where the match starts on that line: a box's candidate spans from the text's start, so its
    // last `\boxed`/`\fbox` there.
    let from = c.start.max(line);
    let span = &text[from..last];
    let anchor = span.rfind("\\boxed").or_else(|| span.rfind("\\fbox")).map_or(from, |i| from + i);
    Some(sentence_start(text, line, anchor))
}

/// The start of the sentence holding byte `anchor`, not before `line`: the first non-space after
/// the last `.`, `!` or `?` that whitespace follows in `text[line..anchor]` (so `3.33` ends no
/// sentence, `0.167. So` does).
fn sentence_start(text: &str, line: usize, anchor: usize) -> usize {
    let b = &text.as_bytes()[line..anchor];
    let mut at = line;
    for i in 0..b.len() {
        if matches!(b[i], b'.' | b'!' | b'?') && b.get(i + 1).is_some_and(u8::is_ascii_whitespace) {
            let gap = b[i + 1..].iter().take_while(|x| x.is_ascii_whitespace()).count();
            at = line + i + 1 + gap;
        }
    }
    at
}

/// The `cot_end` of a continuation of a `prefix`-token trace prefix (a reset), counted from the
/// continuation's first token, given `cot_end` of prefix + continuation: empty (0) when the chain
/// of thought ended inside the prefix (the answer sentence read there), `None` when it never ended.
pub fn continuation_cot_end(cot_end: Option<usize>, prefix: usize) -> Option<usize> {
    cot_end.map(|c| c.saturating_sub(prefix))
}

/// The chain of thought of a reference solution u* written as `<think>…</think>answer`: the text
/// between the markers (newlines at both ends dropped), scored as v_t's target after a partial
/// chain of thought. A solution without the end marker is returned whole.
pub fn reasoning_body(solution: &str) -> &str {
    let Some(close) = solution.find(THINK_CLOSE) else {
        return solution;
    };
    let body = &solution[..close];
    let body = body
        .find(THINK_OPEN)
        .map_or(body, |o| &body[o + THINK_OPEN.len()..]);
    body.trim_matches('\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_of_thought_closes_after_the_first_end_token() {
        assert_eq!(closed_at(&[5, 6, 9, 7, 9], 9), Some(3));
        assert_eq!(closed_at(&[5, 6], 9), None);
        assert_eq!(closed_at(&[9], 9), Some(1));
    }

    #[test]
    fn the_answer_is_the_sentence_of_the_extracted_answer_on_its_line() {
        let text = "Add 3: 5 + 3 = 8\nSubtract 2: 8 - 2 = 6\nThe answer is 6.";
        let at = answer_start(text, "6").unwrap();
        assert_eq!(&text[at..], "The answer is 6.");
        let boxed = "so x = 4\nThus \\boxed{4}";
        assert_eq!(&boxed[answer_start(boxed, "4").unwrap()..], "Thus \\boxed{4}");
        assert_eq!(answer_start("The answer is 6.", "6"), Some(0));
        assert_eq!(answer_start("no number here", "6"), None);
        // Reasoning and answer on one line: the answer is the sentence holding it.
        let one = "Add 3: 5 + 3 = 8. Subtract 2: 8 - 2 = 6.  The answer is 6.";
        assert_eq!(&one[answer_start(one, "6").unwrap()..], "The answer is 6.");
        let last = "It is 1/6, about 0.167! So, the probability is 0.17.";
        assert_eq!(&last[answer_start(last, "0.17").unwrap()..], "So, the probability is 0.17.");
        let boxed = "x = 2 + 2 = 4. Thus \\boxed{4}.";
        assert_eq!(&boxed[answer_start(boxed, "4").unwrap()..], "Thus \\boxed{4}.");
        // A decimal point ends no sentence; nor does a stop after the answer.
        let money = "Each costs $3.33 so two cost $6.66. Done.";
        assert_eq!(answer_start(money, "6.66"), Some(0), "{money}");
        // The line rule still holds: a sentence never starts before the answer's line.
        let lines = "First. Second\nso 4 + 4 = 8";
        assert_eq!(&lines[answer_start(lines, "8").unwrap()..], "so 4 + 4 = 8");
    }

    #[test]
    fn a_continuation_counts_its_chain_of_thought_from_its_first_token() {
        assert_eq!(continuation_cot_end(Some(9), 4), Some(5));
        // Ended at or before the prefix's end: the continuation has an empty chain of thought.
        assert_eq!(continuation_cot_end(Some(4), 4), Some(0));
        assert_eq!(continuation_cot_end(Some(2), 4), Some(0));
        assert_eq!(continuation_cot_end(None, 4), None);
    }

    #[test]
    fn the_reference_chain_of_thought_is_inside_the_markers() {
        assert_eq!(
            reasoning_body("<think>\nStart with 5.\nAdd 3: 5 + 3 = 8\n</think>\nThe answer is 8."),
            "Start with 5.\nAdd 3: 5 + 3 = 8"
        );
        assert_eq!(reasoning_body("steps\n</think>\n\n**8**"), "steps");
        assert_eq!(
            reasoning_body("Start with 5.\nThe answer is 5."),
            "Start with 5.\nThe answer is 5."
        );
    }
}
