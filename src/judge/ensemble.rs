//! The ensemble: which votes to ask for (every row with a reference × templates × samples), and
//! how their replies become `correct_judge`, the per-vote table, counts and metrics. Shared by
//! both judge backends, so they differ only in how a reply is obtained.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::templates::Template;
use super::vote::{parse_verdict, Tally, Verdict};
use super::Message;
use crate::artifact::rows::EvalRow;
use crate::engine::hash::sha256_hex;

/// Params of the vote plan (stage params of both judge stages).
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Samples per template (k).
    pub samples: usize,
    pub seed: u64,
    /// System message before the template's user message ("" = none).
    pub system: String,
    /// Responses longer than this many characters are cut to their last part (where the final
    /// answer is), marked with "[…]"; 0 = never cut.
    pub max_response_chars: usize,
}

/// One vote to ask for.
#[derive(Debug, Clone)]
pub struct Vote {
    /// Index into the eval rows.
    pub row: usize,
    /// Index into the templates.
    pub template: usize,
    /// Sample index within (row, template), 0..k.
    pub vote: usize,
    pub messages: Vec<Message>,
    /// The sampling seed (fits in 31 bits, so every server takes it).
    pub seed: u64,
    pub truncated: bool,
}

/// One row of the `judgments` table: a vote and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgmentRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    pub template: String,
    pub vote: i32,
    pub reply: String,
    /// yes | no | invalid
    pub verdict: String,
}

/// The seed of vote `vote` under template `template`: the same for every row (the request text
/// differs anyway), so identical requests share a cache entry.
pub fn vote_seed(seed: u64, template: &str, vote: usize) -> u64 {
    let h = sha256_hex(format!("judge\u{0}{seed}\u{0}{template}\u{0}{vote}").as_bytes());
    u64::from_str_radix(&h[..8], 16).expect("hex") >> 1
}

/// The response as the judge sees it: its last `max_chars` characters when it is longer.
fn clip_response(text: &str, max_chars: usize) -> (String, bool) {
    let n = text.chars().count();
    if max_chars == 0 || n <= max_chars {
        return (text.to_string(), false);
    }
    let start = text.char_indices().nth(n - max_chars).map_or(0, |(i, _)| i);
    (format!("[…]{}", &text[start..]), true)
}

/// Every vote of the ensemble, row by row. Rows without a reference answer get none (they are
/// judged not correct and counted).
pub fn plan_votes(rows: &[EvalRow], templates: &[Template], opts: &PlanOptions) -> Vec<Vote> {
    let mut votes = Vec::with_capacity(rows.len() * templates.len() * opts.samples);
    for (r, row) in rows.iter().enumerate() {
        let Some(reference) = row.reference.as_deref().filter(|s| !s.trim().is_empty()) else { continue };
        let (response, truncated) = clip_response(&row.text, opts.max_response_chars);
        for (t, template) in templates.iter().enumerate() {
            let mut messages = Vec::with_capacity(2);
            if !opts.system.is_empty() {
                messages.push(Message { role: "system".into(), content: opts.system.clone() });
            }
            messages.push(Message { role: "user".into(), content: template.render(&row.question, &response, reference) });
            for vote in 0..opts.samples {
                votes.push(Vote {
                    row: r,
                    template: t,
                    vote,
                    messages: messages.clone(),
                    seed: vote_seed(opts.seed, &template.name, vote),
                    truncated,
                });
            }
        }
    }
    votes
}

/// Eval rows with `correct_judge` filled, the per-vote table, counts (run-record counters) and
/// metrics.
#[derive(Debug)]
pub struct Aggregate {
    pub rows: Vec<EvalRow>,
    pub judgments: Vec<JudgmentRow>,
    pub counts: BTreeMap<&'static str, i64>,
    pub metrics: Map<String, Value>,
}

fn mean(hits: usize, n: usize) -> Value {
    if n == 0 {
        Value::Null
    } else {
        json!(hits as f64 / n as f64)
    }
}

/// Majority vote per row over all its votes (templates × samples); see [`Tally::decide`] for
/// abstentions and ties. `replies[i]` answers `votes[i]`.
pub fn aggregate(mut rows: Vec<EvalRow>, templates: &[Template], votes: &[Vote], replies: &[String]) -> Aggregate {
    assert_eq!(votes.len(), replies.len(), "one reply per vote");
    let mut tallies = vec![Tally::default(); rows.len()];
    let mut per_template = vec![vec![Tally::default(); templates.len()]; rows.len()];
    let mut judgments = Vec::with_capacity(votes.len());
    let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
    let mut count = |k: &'static str, n: i64| *counts.entry(k).or_insert(0) += n;
    for (v, reply) in votes.iter().zip(replies) {
        let verdict = parse_verdict(reply);
        tallies[v.row].add(verdict);
        per_template[v.row][v.template].add(verdict);
        count("votes", 1);
        count("invalid_votes", (verdict == Verdict::Invalid) as i64);
        let row = &rows[v.row];
        judgments.push(JudgmentRow {
            prompt_id: row.prompt_id.clone(),
            sample_idx: row.sample_idx,
            template: templates[v.template].name.clone(),
            vote: v.vote as i32,
            reply: reply.clone(),
            verdict: verdict.as_str().to_string(),
        });
    }
    let judged: Vec<bool> = {
        let mut j = vec![false; rows.len()];
        votes.iter().for_each(|v| j[v.row] = true);
        j
    };
    count("responses_truncated", votes.iter().filter(|v| v.truncated && v.template == 0 && v.vote == 0).count() as i64);

    let (mut agree, mut judged_n, mut vote_agreement) = (0usize, 0usize, 0.0f64);
    let mut template_agree = vec![0usize; templates.len()];
    let mut by_bench: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (i, row) in rows.iter_mut().enumerate() {
        count("rows_no_extracted_answer", row.answer.is_none() as i64);
        let correct = if judged[i] {
            let d = tallies[i].decide();
            judged_n += 1;
            agree += (d.correct == row.correct_verifier) as usize;
            vote_agreement += d.agreement;
            count("judge_ties", d.tie as i64);
            count("rows_no_valid_vote", (tallies[i].yes + tallies[i].no == 0) as i64);
            for (t, tally) in per_template[i].iter().enumerate() {
                template_agree[t] += (tally.decide().correct == row.correct_verifier) as usize;
            }
            d.correct
        } else {
            count("rows_no_reference", 1);
            false
        };
        row.correct_judge = Some(correct);
        let b = by_bench.entry(row.benchmark.clone()).or_default();
        b.0 += correct as usize;
        b.1 += 1;
    }
    count("rows_judged", judged_n as i64);
    count("judge_verifier_disagreements", (judged_n - agree) as i64);

    let n = rows.len();
    let mut metrics = Map::new();
    metrics.insert("judge_accuracy".into(), mean(rows.iter().filter(|r| r.correct_judge == Some(true)).count(), n));
    metrics.insert("verifier_accuracy".into(), mean(rows.iter().filter(|r| r.correct_verifier).count(), n));
    metrics.insert("agreement_with_verifier".into(), mean(agree, judged_n));
    metrics.insert("vote_agreement".into(), if judged_n == 0 { Value::Null } else { json!(vote_agreement / judged_n as f64) });
    metrics.insert("invalid_vote_rate".into(), mean(counts.get("invalid_votes").copied().unwrap_or(0) as usize, votes.len()));
    metrics.insert(
        "judge_accuracy_by_benchmark".into(),
        Value::Object(by_bench.into_iter().map(|(b, (c, n))| (b, mean(c, n))).collect()),
    );
    metrics.insert(
        "agreement_with_verifier_by_template".into(),
        Value::Object(templates.iter().zip(template_agree).map(|(t, a)| (t.name.clone(), mean(a, judged_n))).collect()),
    );
    Aggregate { rows, judgments, counts, metrics }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::templates::resolve;

    fn row(id: &str, reference: Option<&str>, text: &str, verifier: bool) -> EvalRow {
        EvalRow {
            prompt_id: id.into(),
            benchmark: "toy".into(),
            sample_idx: 0,
            question: format!("question {id}"),
            reference: reference.map(String::from),
            text: text.into(),
            answer: Some("1".into()),
            correct_verifier: verifier,
            correct_judge: None,
        }
    }

    fn opts(samples: usize) -> PlanOptions {
        PlanOptions { samples, seed: 3, system: String::new(), max_response_chars: 0 }
    }

    #[test]
    fn plan_covers_rows_with_a_reference_times_templates_times_samples() {
        let ts = resolve(&["equivalence".into(), "grader".into()]).unwrap();
        let rows = vec![row("a", Some("4"), "so 4", true), row("b", None, "5", false), row("c", Some("7"), "8", false)];
        let votes = plan_votes(&rows, &ts, &opts(3));
        assert_eq!(votes.len(), 2 * 2 * 3);
        assert!(votes.iter().all(|v| v.row != 1));
        // Seeds differ across samples and templates, and repeat across rows.
        let seeds = |r: usize| votes.iter().filter(|v| v.row == r).map(|v| v.seed).collect::<Vec<_>>();
        assert_eq!(seeds(0), seeds(2));
        let mut s = seeds(0);
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 6);
        assert!(votes.iter().all(|v| v.seed < (1 << 31)));
        assert!(votes[0].messages[0].content.contains("question a") && votes[0].messages[0].content.contains("so 4"));
        let with_system = plan_votes(&rows, &ts, &PlanOptions { system: "be strict".into(), ..opts(1) });
        assert_eq!(with_system[0].messages.len(), 2);
        assert_eq!(with_system[0].messages[0].role, "system");
    }

    #[test]
    fn long_responses_keep_their_end() {
        let (c, cut) = clip_response("abcdefghij", 4);
        assert_eq!((c.as_str(), cut), ("[…]ghij", true));
        assert_eq!(clip_response("abc", 4), ("abc".to_string(), false));
        assert_eq!(clip_response("ééééé", 2).0, "[…]éé");
    }

    #[test]
    fn aggregation_fills_every_row_and_counts() {
        let ts = resolve(&["equivalence".into(), "grader".into()]).unwrap();
        let rows = vec![
            row("yes", Some("4"), "4", true),    // judged yes, verifier agrees
            row("no", Some("4"), "5", true),     // judged no, verifier disagrees
            row("tie", Some("4"), "4", false),   // tie -> not correct
            row("none", None, "4", false),       // no reference
            row("junk", Some("4"), "4", false),  // every vote invalid
        ];
        let votes = plan_votes(&rows, &ts, &opts(2));
        let replies: Vec<String> = votes
            .iter()
            .map(|v| match (rows[v.row].prompt_id.as_str(), v.template) {
                ("yes", _) => "Verdict: YES".to_string(),
                ("no", 0) => "Verdict: NO".to_string(),
                ("no", _) => "I am not sure".to_string(),
                ("tie", 0) => "\\boxed{yes}".to_string(),
                ("tie", _) => "\\boxed{no}".to_string(),
                _ => "hmm".to_string(),
            })
            .collect();
        let agg = aggregate(rows, &ts, &votes, &replies);
        let judge: Vec<Option<bool>> = agg.rows.iter().map(|r| r.correct_judge).collect();
        assert_eq!(judge, vec![Some(true), Some(false), Some(false), Some(false), Some(false)]);
        assert_eq!(agg.judgments.len(), votes.len());
        assert_eq!(agg.judgments[0].verdict, "yes");
        let c = |k: &str| agg.counts.get(k).copied().unwrap_or(0);
        assert_eq!((c("votes"), c("invalid_votes")), (16, 2 + 4));
        assert_eq!((c("rows_judged"), c("rows_no_reference"), c("judge_ties"), c("rows_no_valid_vote")), (4, 1, 2, 1));
        // Judged rows: yes agrees, no disagrees (verifier true), tie agrees (false), junk agrees (false).
        assert_eq!(c("judge_verifier_disagreements"), 1);
        assert_eq!(agg.metrics["agreement_with_verifier"], json!(0.75));
        assert_eq!(agg.metrics["judge_accuracy"], json!(0.2));
        assert_eq!(agg.metrics["judge_accuracy_by_benchmark"]["toy"], json!(0.2));
    }
}
