//! Judge prompt templates: the built-in ones and user templates given as text.
//!
//! A template is text with the placeholders `{question}`, `{response}` and `{reference}`. They are
//! substituted in one left-to-right pass, so a placeholder that appears *inside* a response (a
//! model may well write `{reference}`) is never expanded again.

use super::JudgeError;

/// The built-in templates (paper: an ensemble of 2 prompts). Each asks for a verdict in a form
/// that [`super::vote::parse_verdict`] reads; they differ in wording and in the verdict format so
/// their errors are less correlated.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "equivalence",
        "You are checking a student's answer to a math problem.\n\n\
         Problem:\n{question}\n\n\
         Reference answer:\n{reference}\n\n\
         Student response:\n{response}\n\n\
         Is the student's final answer mathematically equivalent to the reference answer? \
         Ignore formatting, units and how the answer was reached. Think briefly, then end your \
         reply with a last line that is exactly `Verdict: YES` or `Verdict: NO`.",
    ),
    (
        "grader",
        "Grade the final answer of a solution against the ground truth.\n\n\
         Question: {question}\n\
         Ground truth: {reference}\n\
         Solution:\n{response}\n\n\
         Reply \\boxed{yes} if the solution's final answer equals the ground truth (equivalent \
         forms such as 0.5 and 1/2 count as equal), otherwise reply \\boxed{no}.",
    ),
];

/// The placeholders a template may use; `{response}` and `{reference}` are required.
const PLACEHOLDERS: [&str; 3] = ["question", "response", "reference"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// A built-in name, or `custom<i>` for the i-th template given as text.
    pub name: String,
    pub text: String,
}

impl Template {
    /// The prompt for one (question, response, reference).
    pub fn render(&self, question: &str, response: &str, reference: &str) -> String {
        let mut out = String::with_capacity(self.text.len() + question.len() + response.len() + reference.len());
        let mut rest = self.text.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let value = after.find('}').and_then(|close| {
                let v = match &after[..close] {
                    "question" => question,
                    "response" => response,
                    "reference" => reference,
                    _ => return None,
                };
                Some((v, close))
            });
            match value {
                Some((v, close)) => {
                    out.push_str(v);
                    rest = &after[close + 1..];
                }
                None => {
                    out.push('{');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// Resolves the `templates` param: each entry is a built-in name or a template text (anything
/// containing `{`). At least one; texts must contain `{response}` and `{reference}`.
pub fn resolve(specs: &[String]) -> Result<Vec<Template>, JudgeError> {
    if specs.is_empty() {
        return Err(JudgeError::Template("no judge templates given (param `templates`)".into()));
    }
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let t = if spec.contains('{') {
            for required in ["{response}", "{reference}"] {
                if !spec.contains(required) {
                    return Err(JudgeError::Template(format!("template {i} has no {required} placeholder (placeholders: {PLACEHOLDERS:?})")));
                }
            }
            Template { name: format!("custom{i}"), text: spec.clone() }
        } else {
            let (name, text) = BUILTIN.iter().find(|(n, _)| n == spec).ok_or_else(|| {
                let known: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
                JudgeError::Template(format!("unknown judge template `{spec}` (built-in: {known:?}; or give a template text with {{response}} and {{reference}})"))
            })?;
            Template { name: name.to_string(), text: text.to_string() }
        };
        if out.iter().any(|o: &Template| o.name == t.name) {
            return Err(JudgeError::Template(format!("judge template `{}` given twice", t.name)));
        }
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_use_every_placeholder_and_resolve_by_name() {
        let names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
        let ts = resolve(&names).unwrap();
        assert!(ts.len() >= 2);
        for t in &ts {
            let r = t.render("QQQ", "RRR", "GGG");
            for v in ["QQQ", "RRR", "GGG"] {
                assert!(r.contains(v), "{}: {r}", t.name);
            }
            assert!(!r.contains("{question}") && !r.contains("{response}") && !r.contains("{reference}"));
        }
    }

    #[test]
    fn substitution_is_one_pass_and_keeps_other_braces() {
        let t = Template { name: "t".into(), text: "Q={question} R={response} G={reference} \\boxed{yes} {other".into() };
        let r = t.render("a{b}", "I think {reference} is {question}", "42");
        assert_eq!(r, "Q=a{b} R=I think {reference} is {question} G=42 \\boxed{yes} {other");
    }

    #[test]
    fn custom_templates_are_checked() {
        let ts = resolve(&["grader".into(), "Is {response} equal to {reference}? YES or NO".into()]).unwrap();
        assert_eq!((ts[0].name.as_str(), ts[1].name.as_str()), ("grader", "custom1"));
        let e = resolve(&["Is {response} right?".into()]).unwrap_err().to_string();
        assert!(e.contains("{reference}"), "{e}");
        let e = resolve(&["nope".into()]).unwrap_err().to_string();
        assert!(e.contains("unknown judge template `nope`") && e.contains("equivalence"), "{e}");
        assert!(resolve(&[]).is_err());
        assert!(resolve(&["grader".into(), "grader".into()]).is_err());
    }
}
