//! Reading a verdict out of a judge's reply, and the majority vote over an ensemble of replies.

/// One judge vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The response's answer matches the reference.
    Yes,
    No,
    /// No verdict could be read from the reply (an abstention; counted as `invalid_votes`).
    Invalid,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Yes => "yes",
            Verdict::No => "no",
            Verdict::Invalid => "invalid",
        }
    }
}

/// A verdict word: yes/no and their usual synonyms (`correct`, `true`, `equivalent`, ...).
fn word_verdict(word: &str) -> Option<Verdict> {
    let w: String = word.trim().trim_matches(|c: char| !c.is_alphanumeric()).to_ascii_lowercase();
    match w.as_str() {
        "yes" | "correct" | "true" | "equivalent" | "right" => Some(Verdict::Yes),
        "no" | "incorrect" | "false" | "wrong" | "inequivalent" => Some(Verdict::No),
        _ => None,
    }
}

/// The verdict of a reply, looked for in this order (the last occurrence wins in each):
/// 1. `\boxed{yes}` / `\boxed{no}` (or a synonym inside the box);
/// 2. a `Verdict:`, `Final answer:`, `Answer:` or `Judgement:` label followed by yes/no;
/// 3. the reply's last word, if it is yes/no or a synonym.
///
/// A reasoning model's `<think>…</think>` part is skipped. Anything else is [`Verdict::Invalid`].
pub fn parse_verdict(reply: &str) -> Verdict {
    let text = match reply.rfind("</think>") {
        Some(i) => &reply[i + "</think>".len()..],
        None => reply,
    };
    let lower = text.to_ascii_lowercase();
    // 1. \boxed{...}
    if let Some(v) = lower.rmatch_indices("\\boxed{").find_map(|(i, m)| {
        let inner = &lower[i + m.len()..];
        let inner = &inner[..inner.find('}')?];
        word_verdict(inner.trim_start_matches("\\text{"))
    }) {
        return v;
    }
    // 2. a labelled verdict
    for label in ["verdict", "final answer", "answer", "judgement", "judgment"] {
        if let Some(v) = lower.rmatch_indices(label).find_map(|(i, m)| {
            let after = lower[i + m.len()..].trim_start_matches(['*', ' ', '"']);
            let after = after.strip_prefix(':').or_else(|| after.strip_prefix(" is"))?;
            let word = after.trim_start_matches(|c: char| !c.is_alphanumeric()).split(|c: char| !c.is_alphanumeric()).next()?;
            word_verdict(word)
        }) {
            return v;
        }
    }
    // 3. the last word
    lower.split_whitespace().last().and_then(word_verdict).unwrap_or(Verdict::Invalid)
}

/// Votes counted for one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub yes: usize,
    pub no: usize,
    pub invalid: usize,
}

/// The outcome of a majority vote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub correct: bool,
    /// As many yes as no votes (including 0 = 0: every vote invalid).
    pub tie: bool,
    /// Share of the valid votes that agree with the decision (1.0 = unanimous; 0 without valid votes).
    pub agreement: f64,
}

impl Tally {
    pub fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Yes => self.yes += 1,
            Verdict::No => self.no += 1,
            Verdict::Invalid => self.invalid += 1,
        }
    }

    /// Majority of the valid votes; invalid votes abstain. A tie (no valid vote included) is
    /// decided as *not correct*: the ensemble did not establish that the answers match, the same
    /// rule as for an unparseable model answer. Ties are counted (`judge_ties`) so a run with many
    /// of them shows up.
    pub fn decide(&self) -> Decision {
        let valid = self.yes + self.no;
        let correct = self.yes > self.no;
        let agreement = if valid == 0 { 0.0 } else { self.yes.max(self.no) as f64 / valid as f64 };
        Decision { correct, tie: self.yes == self.no, agreement }
    }
}

#[cfg(test)]
mod tests {
    use super::Verdict::*;
    use super::*;

    #[test]
    fn verdicts_are_read_from_the_usual_forms() {
        let cases = [
            ("Both are 12.\nVerdict: YES", Yes),
            ("The student wrote 11.\n**Verdict:** NO", No),
            ("so \\boxed{yes}", Yes),
            ("\\boxed{\\text{no}}", No),
            ("First I thought \\boxed{no} but then \\boxed{yes}", Yes),
            ("Final answer: correct.", Yes),
            ("The answer is incorrect", No),
            ("<think>Verdict: YES? Let me check again.</think>\nVerdict: NO", No),
            ("yes", Yes),
            ("No.", No),
            ("I cannot decide.", Invalid),
            ("", Invalid),
            ("Verdict: maybe", Invalid),
            ("\\boxed{42}", Invalid),
        ];
        for (reply, want) in cases {
            assert_eq!(parse_verdict(reply), want, "{reply:?}");
        }
    }

    #[test]
    fn majority_vote_with_abstentions_and_ties() {
        let tally = |vs: &[Verdict]| {
            let mut t = Tally::default();
            vs.iter().for_each(|&v| t.add(v));
            t.decide()
        };
        assert_eq!(tally(&[Yes, Yes, No]), Decision { correct: true, tie: false, agreement: 2.0 / 3.0 });
        assert!(!tally(&[No, Invalid, Invalid, Yes, No]).correct);
        // Invalid votes abstain: one valid yes decides.
        assert_eq!(tally(&[Invalid, Invalid, Yes]), Decision { correct: true, tie: false, agreement: 1.0 });
        // Ties, and no valid vote at all, are decided as not correct.
        assert_eq!(tally(&[Yes, No]), Decision { correct: false, tie: true, agreement: 0.5 });
        assert_eq!(tally(&[Invalid, Invalid]), Decision { correct: false, tie: true, agreement: 0.0 });
    }
}
