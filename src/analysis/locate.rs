//! Finding the first wrong step of an incorrect trace, by one of two locators: against the
//! default world's worked solution, or from the trace's own arithmetic claims.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use super::first_wrong::{first_wrong, reference_steps, Verdict};
use super::first_wrong_arith::first_wrong_arithmetic;
use crate::artifact::rows::{PromptRow, RolloutRow};
use crate::prompt_text::prompt_text;

/// How the first wrong step of a trace is found (param `locator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Locator {
    /// Against the default world's worked solution, step by step ([`super::first_wrong`]).
    Taskgen,
    /// A free-form trace's own claims: the first false computation or value from nowhere
    /// ([`super::first_wrong_arith`]); for real models on GSM8K-style problems.
    Arithmetic,
}

/// A problem's parsed reference: its start value and steps (op, operand), as `reference_steps` gives them.
type ParsedReference = (i64, Vec<(char, i64)>);

/// Finds the first wrong step of incorrect rollouts, caching each problem's parsed reference.
pub struct FirstWrong<'a> {
    locator: Locator,
    prompts_path: &'a Path,
    by_id: HashMap<&'a str, (usize, &'a PromptRow)>,
    references: HashMap<&'a str, ParsedReference>,
}

impl<'a> FirstWrong<'a> {
    pub fn new(locator: Locator, prompts_path: &'a Path, prompts: &'a [PromptRow]) -> Self {
        let by_id = prompts.iter().enumerate().map(|(i, p)| (p.id.as_str(), (i, p))).collect();
        Self { locator, prompts_path, by_id, references: HashMap::new() }
    }

    /// The verdict on rollout `r` whose completion tokens read `texts` (errors name `at`).
    pub fn verdict(&mut self, r: &'a RolloutRow, texts: &[String], at: &dyn Fn() -> String) -> Result<Verdict> {
        let Some(&(prow, prompt)) = self.by_id.get(r.prompt_id.as_str()) else {
            bail!("{}: no prompt with this id in {}", at(), self.prompts_path.display());
        };
        Ok(match self.locator {
            Locator::Taskgen => {
                if !self.references.contains_key(r.prompt_id.as_str()) {
                    let solution = prompt.solution.as_deref().ok_or_else(|| anyhow!("{} row {prow} (prompt {}): no reference solution", self.prompts_path.display(), prompt.id))?;
                    let parsed = reference_steps(solution).with_context(|| {
                        format!("{} row {prow} (prompt {}): the reference solution is not a taskgen worked solution, so no first wrong step can be located (locator = \"arithmetic\" checks free-form traces)", self.prompts_path.display(), prompt.id)
                    })?;
                    self.references.insert(r.prompt_id.as_str(), parsed);
                }
                let (start, steps) = &self.references[r.prompt_id.as_str()];
                first_wrong(&texts.concat(), *start, steps)
            }
            // Only the chain of thought: the answer after it is no step.
            Locator::Arithmetic => first_wrong_arithmetic(&prompt_text(&prompt.prompt), &texts[..r.cot_len().min(texts.len())].concat()),
        })
    }
}
