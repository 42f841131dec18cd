//! `taskgen`: procedural, verifiable multi-step arithmetic problems (the default world's task).
//!
//! Two kinds, both a chain of integer operations on one running value:
//! - `chain`: "Start with 12. Add 5. Multiply by 3. What is the result?"
//! - `word`: "Mia has 12 apples. Mia buys 5 more apples. … How many apples does Mia have now?"
//!
//! The reference solution u* thinks like a reasoning model: `<think>`, one operation per line with
//! its intermediate result (`Add 5: 12 + 5 = 17`), `</think>`, then `The answer is N.` on its own
//! line (so the quickstart runs the same end-of-thinking path as R1-distill or Qwen3); the
//! reference answer y* is `N`. All
//! values stay positive integers (division only by exact divisors), bounded by `max_value`.
//! Distractor sentences add numbers that do not enter the answer. The language is deliberately
//! small and regular so a tiny model can learn it in minutes.
//!
//! Splits never share a problem: eval problems are drawn first (their own random stream), train
//! problems skip anything whose normalized text is already taken. Output is a pure function of
//! the params (same seed ⇒ same bytes).

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{bail, ensure};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::prompt_text::{normalize, normalized_hash};
use crate::artifact::rows::PromptRow;
use crate::artifact::{write_rows, Schema};
use crate::credit::thinking::{THINK_CLOSE, THINK_OPEN};
use crate::engine::{Builtin, Executable, StageContext};

/// Difficulty knobs.
#[derive(Debug, Clone)]
pub struct Knobs {
    pub min_steps: usize,
    pub max_steps: usize,
    /// Largest start value and add/subtract operand (multiply/divide use 2..=9 within this).
    pub max_operand: u64,
    /// Largest intermediate value.
    pub max_value: u64,
    /// Up to this many distractor sentences per problem (uniform in 0..=distractors).
    pub distractors: usize,
    /// Probability of a word problem (else a chain).
    pub word_fraction: f64,
}

impl Knobs {
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.min_steps >= 1 && self.min_steps <= self.max_steps,
            "taskgen: need 1 <= min_steps <= max_steps, got {}..{}",
            self.min_steps,
            self.max_steps
        );
        ensure!(
            self.max_operand >= 3,
            "taskgen: max_operand must be >= 3, got {}",
            self.max_operand
        );
        ensure!(
            self.max_value >= 2 * self.max_operand,
            "taskgen: max_value must be >= 2 * max_operand, got {} < {}",
            self.max_value,
            2 * self.max_operand
        );
        ensure!(
            (0.0..=1.0).contains(&self.word_fraction),
            "taskgen: word_fraction must be in [0, 1], got {}",
            self.word_fraction
        );
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

impl Op {
    pub fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Op::Add => a + b,
            Op::Sub => a - b,
            Op::Mul => a * b,
            Op::Div => a / b,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "*",
            Op::Div => "/",
        }
    }

    /// The imperative used in chain problems and in every solution line.
    fn verb(self) -> &'static str {
        match self {
            Op::Add => "Add",
            Op::Sub => "Subtract",
            Op::Mul => "Multiply by",
            Op::Div => "Divide by",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
        }
    }
}

/// One generated problem.
#[derive(Debug, Clone)]
pub struct Problem {
    pub kind: &'static str,
    pub text: String,
    pub solution: String,
    pub answer: u64,
    pub ops: Vec<Op>,
    pub distractors: usize,
}

const NAMES: &[&str] = &[
    "Mia", "Leo", "Ava", "Sam", "Zoe", "Max", "Ivy", "Ben", "Eva", "Tom", "Ana", "Raj",
];
const ITEMS: &[&str] = &[
    "apples", "marbles", "stickers", "coins", "books", "pencils", "cards", "shells", "stamps",
    "candies", "rocks", "buttons",
];

/// A random operation applicable to `v` and its operand, keeping values in 1..=max_value.
fn pick_step(rng: &mut ChaCha8Rng, v: u64, k: &Knobs) -> (Op, u64) {
    let small = k.max_operand.min(9);
    let mut ops = Vec::with_capacity(4);
    if v + 2 <= k.max_value {
        ops.push(Op::Add);
    }
    if v >= 3 {
        ops.push(Op::Sub);
    }
    if v * 2 <= k.max_value {
        ops.push(Op::Mul);
    }
    let divisors: Vec<u64> = (2..=small).filter(|d| v.is_multiple_of(*d)).collect();
    if !divisors.is_empty() {
        ops.push(Op::Div);
    }
    // v >= 3 or v + 2 <= max_value always holds since max_value >= 6, so `ops` is never empty.
    let op = *ops.choose(rng).expect("some operation applies");
    let b = match op {
        Op::Add => rng.random_range(2..=k.max_operand.min(k.max_value - v)),
        Op::Sub => rng.random_range(2..=k.max_operand.min(v - 1)),
        Op::Mul => rng.random_range(2..=small.min(k.max_value / v)),
        Op::Div => *divisors.choose(rng).expect("non-empty"),
    };
    (op, b)
}

/// One problem drawn from `rng`.
pub fn generate(rng: &mut ChaCha8Rng, k: &Knobs) -> Problem {
    let steps = rng.random_range(k.min_steps..=k.max_steps);
    let word = rng.random_bool(k.word_fraction);
    let name = *NAMES.choose(rng).expect("names");
    let other = *NAMES
        .iter()
        .filter(|n| **n != name)
        .collect::<Vec<_>>()
        .choose(rng)
        .expect("names");
    let item = *ITEMS.choose(rng).expect("items");
    let item2 = *ITEMS
        .iter()
        .filter(|i| **i != item)
        .collect::<Vec<_>>()
        .choose(rng)
        .expect("items");

    let start = rng.random_range(3..=k.max_operand);
    let mut v = start;
    let mut sentences = Vec::with_capacity(steps + 2);
    let mut lines = Vec::with_capacity(steps + 2);
    let mut ops = Vec::with_capacity(steps);
    if word {
        sentences.push(format!("{name} has {start} {item}."));
        lines.push(format!("{name} starts with {start} {item}."));
    } else {
        sentences.push(format!("Start with {start}."));
        lines.push(format!("Start with {start}."));
    }
    for _ in 0..steps {
        let (op, b) = pick_step(rng, v, k);
        let after = op.apply(v, b);
        let form = rng.random_range(0..3usize);
        sentences.push(if word {
            match (op, form) {
                (Op::Add, 0) => format!("{name} buys {b} more {item}."),
                (Op::Add, 1) => format!("{name} finds {b} more {item}."),
                (Op::Add, _) => format!("{other} gives {name} {b} {item}."),
                (Op::Sub, 0) => format!("{name} loses {b} {item}."),
                (Op::Sub, 1) => format!("{name} sells {b} {item}."),
                (Op::Sub, _) => format!("{name} gives {b} {item} to {other}."),
                (Op::Mul, 0 | 1) => format!("{name} ends up with {b} times as many {item}."),
                (Op::Mul, _) => format!("The number of {item} {name} has grows {b} times."),
                (Op::Div, _) => {
                    format!("{name} splits the {item} into {b} equal piles and keeps one pile.")
                }
            }
        } else {
            format!("{} {b}.", op.verb())
        });
        lines.push(format!(
            "{} {b}: {v} {} {b} = {after}",
            op.verb(),
            op.symbol()
        ));
        ops.push(op);
        v = after;
    }
    let n_distractors = rng.random_range(0..=k.distractors);
    for _ in 0..n_distractors {
        let n = rng.random_range(2..=k.max_operand);
        let s = if word {
            match rng.random_range(0..3usize) {
                0 => format!("{other} has {n} {item2}."),
                1 => format!("{other} is {n} years old."),
                _ => format!("{name} walks {n} blocks to the shop."),
            }
        } else {
            format!("Do not use the number {n}.")
        };
        // Anywhere after the opening sentence.
        let at = rng.random_range(1..=sentences.len());
        sentences.insert(at, s);
    }
    sentences.push(if word {
        format!("How many {item} does {name} have now?")
    } else {
        "What is the result?".to_string()
    });
    Problem {
        kind: if word { "word" } else { "chain" },
        text: sentences.join(" "),
        solution: format!(
            "{THINK_OPEN}\n{}\n{THINK_CLOSE}\nThe answer is {v}.",
            lines.join("\n")
        ),
        answer: v,
        ops,
        distractors: n_distractors,
    }
}

/// A worked solution as an imperfect teacher writes it: the thinking closes before the last
/// operation and the answer is the value reached so far (`bootstrap_sft`'s `teacher_skip_rate`).
/// A policy distilled from such demonstrations skips the last step at some rate, a habit only the
/// outcome reward reveals. `None` unless `solution` is taskgen's format with at least two steps.
pub fn solution_skipping_last_step(solution: &str) -> Option<String> {
    let lines: Vec<&str> = solution.lines().collect();
    let open = lines.iter().position(|l| l.trim() == THINK_OPEN)?;
    let close = lines.iter().position(|l| l.trim() == THINK_CLOSE)?;
    // The start line, then at least two step lines.
    if close < open + 4 || !lines.get(close + 1)?.starts_with("The answer is ") {
        return None;
    }
    let kept = &lines[open + 1..close - 1];
    let value: u64 = kept.last()?.rsplit_once(" = ")?.1.trim().parse().ok()?;
    Some(format!(
        "{THINK_OPEN}\n{}\n{THINK_CLOSE}\nThe answer is {value}.",
        kept.join("\n")
    ))
}

/// `n` problems from `rng` whose normalized text is not in `taken` (which they are added to).
fn draw_unique(
    rng: &mut ChaCha8Rng,
    k: &Knobs,
    n: usize,
    taken: &mut HashSet<String>,
    split: &str,
) -> anyhow::Result<Vec<Problem>> {
    let max_attempts = 50 * n + 1000;
    let mut out = Vec::with_capacity(n);
    let mut attempts = 0;
    while out.len() < n {
        if attempts == max_attempts {
            bail!(
                "taskgen: only {} distinct {split} problems after {attempts} draws (wanted {n}); the knobs allow too few problems: raise max_operand, max_steps or distractors, or lower n_{split}",
                out.len()
            );
        }
        attempts += 1;
        let p = generate(rng, k);
        if taken.insert(normalize(&p.text)) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Eval and train problems for `seed`: disjoint by normalized text.
pub fn splits(
    seed: u64,
    k: &Knobs,
    n_train: usize,
    n_eval: usize,
) -> anyhow::Result<(Vec<Problem>, Vec<Problem>)> {
    k.check()?;
    let mut taken = HashSet::new();
    let mut eval_rng = ChaCha8Rng::seed_from_u64(seed);
    eval_rng.set_stream(1);
    let eval = draw_unique(&mut eval_rng, k, n_eval, &mut taken, "eval")?;
    let mut train_rng = ChaCha8Rng::seed_from_u64(seed);
    train_rng.set_stream(0);
    let train = draw_unique(&mut train_rng, k, n_train, &mut taken, "train")?;
    Ok((train, eval))
}

fn rows(problems: &[Problem], split: &str, seed: u64) -> Vec<PromptRow> {
    problems
        .iter()
        .map(|p| PromptRow {
            id: format!("tg-{}", &normalized_hash(&p.text)[..16]),
            prompt: p.text.clone(),
            answer: Some(p.answer.to_string()),
            solution: Some(p.solution.clone()),
            source: "taskgen".into(),
            meta: json!({
                "split": split,
                "kind": p.kind,
                "steps": p.ops.len(),
                "ops": p.ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(","),
                "distractors": p.distractors,
                "seed": seed,
            })
            .to_string(),
        })
        .collect()
}

/// Params of `taskgen` (defaults and their docs: `stages/taskgen.toml`).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskgenParams {
    pub seed: u64,
    pub n_train: usize,
    pub n_eval: usize,
    pub min_steps: usize,
    pub max_steps: usize,
    pub max_operand: u64,
    pub max_value: u64,
    pub distractors: usize,
    pub word_fraction: f64,
}

pub const STAGE: Builtin = Builtin { name: "taskgen", version: "2", runs_in: Executable::Engine, run };

/// Stage `taskgen`: outputs `train` and `eval` (schema `prompts`).
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let p: TaskgenParams = ctx.params()?;
    let (seed, n_train, n_eval) = (p.seed, p.n_train, p.n_eval);
    ensure!(n_train > 0 && n_eval > 0, "taskgen: n_train and n_eval must be > 0 (an empty split is not an artifact), got {n_train} and {n_eval}");
    let k = Knobs {
        min_steps: p.min_steps,
        max_steps: p.max_steps,
        max_operand: p.max_operand,
        max_value: p.max_value,
        distractors: p.distractors,
        word_fraction: p.word_fraction,
    };
    let t0 = Instant::now();
    let (train, eval) = splits(seed, &k, n_train, n_eval)?;
    let secs = t0.elapsed().as_secs_f64();
    write_rows(
        ctx.output("train")?,
        Schema::Prompts,
        &rows(&train, "train", seed),
    )?;
    write_rows(
        ctx.output("eval")?,
        Schema::Prompts,
        &rows(&eval, "eval", seed),
    )?;
    ctx.count("train_rows", train.len() as i64);
    ctx.count("eval_rows", eval.len() as i64);
    ctx.metric(
        "problems_per_s",
        ((n_train + n_eval) as f64 / secs.max(1e-9)).round(),
    );
    ctx.metric(
        "mean_steps",
        train.iter().map(|p| p.ops.len()).sum::<usize>() as f64 / train.len() as f64,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipping_teacher_closes_before_the_last_step_and_answers_the_value_so_far() {
        let full = format!("{THINK_OPEN}\nStart with 4.\nAdd 5: 4 + 5 = 9\nMultiply by 3: 9 * 3 = 27\n{THINK_CLOSE}\nThe answer is 27.");
        assert_eq!(
            solution_skipping_last_step(&full).as_deref(),
            Some(format!("{THINK_OPEN}\nStart with 4.\nAdd 5: 4 + 5 = 9\n{THINK_CLOSE}\nThe answer is 9.").as_str())
        );
        let one_step = format!(
            "{THINK_OPEN}\nStart with 4.\nAdd 5: 4 + 5 = 9\n{THINK_CLOSE}\nThe answer is 9."
        );
        assert_eq!(solution_skipping_last_step(&one_step), None);
        assert_eq!(solution_skipping_last_step("The answer is 27."), None);
        // Every generated problem with two or more steps has one, and its answer is the value
        // before the last operation.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            let p = generate(&mut rng, &knobs());
            let flawed = solution_skipping_last_step(&p.solution).expect("taskgen solution");
            let before_last = p.solution.lines().rev().nth(3).unwrap();
            let value = before_last.rsplit_once(" = ").map_or_else(
                || first_number(before_last).unwrap(),
                |(_, v)| v.parse().unwrap(),
            );
            assert!(
                flawed.ends_with(&format!("{THINK_CLOSE}\nThe answer is {value}.")),
                "{flawed}"
            );
            assert_eq!(flawed.lines().count() + 1, p.solution.lines().count());
        }
    }

    fn knobs() -> Knobs {
        Knobs {
            min_steps: 2,
            max_steps: 5,
            max_operand: 20,
            max_value: 200,
            distractors: 2,
            word_fraction: 0.5,
        }
    }

    fn first_number(s: &str) -> Option<u64> {
        let digits: String = s
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    }

    /// Recompute the answer from the problem text alone (an independent reading of the language).
    fn solve(text: &str) -> u64 {
        let sentences: Vec<&str> = text
            .split_inclusive(['.', '?'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let first = sentences[0];
        let mut v = first_number(first).expect("start value");
        let subject = first.split(' ').next().unwrap();
        for s in &sentences[1..sentences.len() - 1] {
            let words: Vec<&str> = s.trim_end_matches('.').split(' ').collect();
            let n = first_number(s);
            if subject == "Start" {
                match words[0] {
                    "Add" => v += n.unwrap(),
                    "Subtract" => v -= n.unwrap(),
                    "Multiply" => v *= n.unwrap(),
                    "Divide" => {
                        assert_eq!(v % n.unwrap(), 0, "inexact division in {text}");
                        v /= n.unwrap()
                    }
                    "Do" => {}
                    w => panic!("unknown chain sentence start `{w}` in {text}"),
                }
                continue;
            }
            let about_subject = words[0] == subject || words.contains(&subject);
            if !about_subject || words.contains(&"walks") {
                continue; // distractor
            }
            if words.contains(&"more") || (words[1] == "gives" && words[2] == subject) {
                v += n.unwrap();
            } else if words.contains(&"loses")
                || words.contains(&"sells")
                || words.contains(&"gives")
            {
                v -= n.unwrap();
            } else if words.contains(&"times") {
                v *= n.unwrap();
            } else if words.contains(&"piles") {
                assert_eq!(v % n.unwrap(), 0, "inexact division in {text}");
                v /= n.unwrap();
            } else {
                panic!("unparsed sentence `{s}` in {text}");
            }
        }
        v
    }

    #[test]
    fn every_answer_is_recomputed_from_the_text_and_every_step_checks() {
        let (train, eval) = splits(3, &knobs(), 3000, 300).unwrap();
        for p in train.iter().chain(&eval) {
            assert_eq!(solve(&p.text), p.answer, "{}\n{}", p.text, p.solution);
            let all: Vec<&str> = p.solution.lines().collect();
            assert_eq!(all.len(), p.ops.len() + 4);
            assert_eq!(
                (all[0], all[all.len() - 2]),
                ("<think>", "</think>"),
                "{}",
                p.solution
            );
            assert_eq!(*all.last().unwrap(), format!("The answer is {}.", p.answer));
            let lines = &all[1..all.len() - 2];
            let mut prev = first_number(lines[0]).unwrap();
            for l in &lines[1..] {
                let (_, eq) = l.split_once(": ").unwrap();
                let t: Vec<&str> = eq.split(' ').collect();
                let (a, b, c): (u64, u64, u64) = (
                    t[0].parse().unwrap(),
                    t[2].parse().unwrap(),
                    t[4].parse().unwrap(),
                );
                assert_eq!(
                    a, prev,
                    "step does not continue from the previous result: {l}"
                );
                let op = match t[1] {
                    "+" => Op::Add,
                    "-" => Op::Sub,
                    "*" => Op::Mul,
                    "/" => Op::Div,
                    o => panic!("bad op {o}"),
                };
                assert_eq!(op.apply(a, b), c, "{l}");
                assert!((1..=200).contains(&c), "{l}");
                prev = c;
            }
            assert_eq!(prev, p.answer);
        }
    }

    #[test]
    fn splits_are_disjoint_and_deterministic() {
        let (train, eval) = splits(11, &knobs(), 2000, 200).unwrap();
        let eval_set: HashSet<String> = eval.iter().map(|p| normalize(&p.text)).collect();
        assert_eq!(eval_set.len(), 200);
        assert!(train
            .iter()
            .all(|p| !eval_set.contains(&normalize(&p.text))));
        let (train2, eval2) = splits(11, &knobs(), 2000, 200).unwrap();
        assert!(train
            .iter()
            .zip(&train2)
            .all(|(a, b)| a.text == b.text && a.solution == b.solution));
        assert!(eval.iter().zip(&eval2).all(|(a, b)| a.text == b.text));
        let (train3, _) = splits(12, &knobs(), 2000, 200).unwrap();
        assert!(
            train.iter().zip(&train3).any(|(a, b)| a.text != b.text),
            "seed must matter"
        );
        // The eval split does not depend on the size of the train split.
        let (_, eval4) = splits(11, &knobs(), 50, 200).unwrap();
        assert!(eval.iter().zip(&eval4).all(|(a, b)| a.text == b.text));
    }

    #[test]
    fn artifact_bytes_are_identical_for_the_same_seed() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, seed: u64| {
            let (train, _) = splits(seed, &knobs(), 500, 50).unwrap();
            let p = dir.path().join(name);
            write_rows(&p, Schema::Prompts, &rows(&train, "train", seed)).unwrap();
            std::fs::read(p).unwrap()
        };
        assert_eq!(write("a.parquet", 5), write("b.parquet", 5));
        assert_ne!(write("c.parquet", 5), write("d.parquet", 6));
    }

    #[test]
    fn knobs_are_respected() {
        let k = Knobs {
            min_steps: 3,
            max_steps: 3,
            max_operand: 9,
            max_value: 50,
            distractors: 0,
            word_fraction: 0.0,
        };
        let (train, _) = splits(1, &k, 300, 10).unwrap();
        for p in &train {
            assert_eq!(p.ops.len(), 3);
            assert_eq!(p.kind, "chain");
            assert_eq!(p.distractors, 0);
            assert!(!p.text.contains("Do not use"));
        }
        let all_word = Knobs {
            word_fraction: 1.0,
            distractors: 3,
            ..k
        };
        let (train, _) = splits(1, &all_word, 300, 10).unwrap();
        assert!(train.iter().all(|p| p.kind == "word"));
        assert!(train.iter().any(|p| p.distractors == 3));
    }

    #[test]
    fn too_small_a_space_is_a_clear_error() {
        let k = Knobs {
            min_steps: 1,
            max_steps: 1,
            max_operand: 3,
            max_value: 6,
            distractors: 0,
            word_fraction: 0.0,
        };
        let err = splits(0, &k, 10_000, 3).unwrap_err().to_string();
        assert!(err.contains("distinct train problems"), "{err}");
        let bad = Knobs {
            min_steps: 4,
            max_steps: 2,
            ..knobs()
        };
        assert!(splits(0, &bad, 10, 10)
            .unwrap_err()
            .to_string()
            .contains("min_steps"));
    }
}
