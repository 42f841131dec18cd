//! The paper pipelines (`pipelines/paper-table1.toml`, `paper-table2.toml`) at toy scale: every
//! model and data file rewired with `--set STAGE.inputs.NAME=file:...` to a tiny model trained by
//! the default world and problems from the task generator, the budgets shrunk with `--set`. Checks
//! that each runs end to end into its report: method rows x the paper's benchmark columns, and
//! for Table 1 the LLM-judge table.

use std::path::{Path, PathBuf};
use std::process::Command;

use rredcot::artifact::rows::{EvalRow, PromptRow};
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

// Each test binary uses part of the shared helpers.
mod common;
use common::{output, record, repo, TINY_WORLD};

fn run(store: &Path, pipeline: &str, sets: &[String]) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(repo().join(pipeline)).arg("--json");
    for s in sets {
        c.args(["--set", s]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A tiny checkpoint from the default world, and task-generator problems written as HF-layout
/// JSONL (problem / solution / answer), the layout the paper's data files have: train and eval
/// problems, and the train problems as NuminaMath-CoT has them (Table 1's training set: the
/// answer boxed in the worked solution, no answer column).
fn toy_world(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let store = dir.join("world");
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(&store).args(["pipeline", "run"]).arg(repo().join("pipelines/quickstart.toml")).args(["--until", "sft", "--json"]);
    for s in TINY_WORLD {
        c.args(["--set", s]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jsonl = |split: &str, n: usize, numina: bool| {
        let rows: Vec<PromptRow> = read_rows(&output(&store, &s, "taskgen", split), Schema::Prompts).unwrap();
        let path = dir.join(format!("{split}{}.jsonl", if numina { "-numina" } else { "" }));
        let lines: Vec<String> = rows[..n]
            .iter()
            .map(|r| {
                let (solution, answer) = (r.solution.as_deref().unwrap(), r.answer.as_deref().unwrap());
                if numina {
                    let stated = format!("The answer is {answer}.");
                    assert!(solution.ends_with(&stated), "{solution}");
                    let boxed = solution.replace(&stated, &format!("The answer is $\\boxed{{{answer}}}$."));
                    serde_json::json!({ "source": "taskgen", "problem": r.prompt, "solution": boxed, "messages": [] })
                } else {
                    serde_json::json!({ "problem": r.prompt, "solution": solution, "answer": answer })
                }
                .to_string()
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    };
    (output(&store, &s, "sft", "model"), jsonl("train", 60, false), jsonl("eval", 8, false), jsonl("train", 60, true))
}

/// The `--set` lines that rewire a paper pipeline to the toy world and shrink its budgets.
fn toy_sets(model: &Path, train: &Path, bench: &Path, benchmarks: &[&str], judged: bool) -> Vec<String> {
    let m = model.display();
    let mut sets = vec![
        format!("import_train.inputs.source=file:{}", train.display()),
        format!("rollout.inputs.policy=file:{m}"),
        format!("update.inputs.policy=file:{m}"),
        format!("update.inputs.optimizer=file:{m}"),
        format!("update.inputs.reference=file:{m}"),
        format!("segment.inputs.tokenizer=file:{m}"),
        format!("score.inputs.policy=file:{m}"),
        format!("eval_base.inputs.policy=file:{m}"),
        "grpo.repeat=2".into(),
        "rredcot.repeat=2".into(),
        "rollout.limit=3".into(),
        "rollout.group_size=2".into(),
        "rollout.max_new_tokens=24".into(),
        "segment.max_segments=6".into(),
        "update.max_completion_length=24".into(),
        "update.dtype=f32".into(),
    ];
    for b in benchmarks {
        sets.push(format!("import_{b}.inputs.source=file:{}", bench.display()));
    }
    for e in ["eval_base", "eval_grpo", "eval_rredcot"] {
        sets.extend([format!("{e}.k=2"), format!("{e}.max_new_tokens=24"), format!("{e}.limit=4")]);
    }
    if judged {
        for j in ["judge_base", "judge_grpo", "judge_rredcot"] {
            sets.extend([format!("{j}.inputs.judge=file:{m}"), format!("{j}.samples=1"), format!("{j}.max_tokens=8")]);
        }
    }
    sets
}

/// The report's CSV as (table, method, benchmark) triples.
fn table_cells(store: &Path, s: &Value) -> Vec<(String, String, String)> {
    let csv = std::fs::read_to_string(output(store, s, "report", "report").join("results.csv")).unwrap();
    csv.lines()
        .skip(1)
        .map(|l| {
            // The table title is quoted and may hold commas; method and benchmark are plain here.
            let rest = l.rsplit_once("\",").map(|(t, r)| (t.trim_start_matches('"').to_string(), r)).unwrap_or_else(|| (String::new(), l));
            let f: Vec<&str> = rest.1.split(',').collect();
            (rest.0, f[0].to_string(), f[1].to_string())
        })
        .collect()
}

#[test]
fn paper_tables_run_at_toy_scale_into_their_reports() {
    let dir = tempfile::tempdir().unwrap();
    let (model, train, bench, train_numina) = toy_world(dir.path());
    let store = dir.path().join("store");

    // Table 2: four benchmarks, three method rows, verifier only.
    let t2 = ["minerva", "aime24", "aime25", "math500"];
    let s = run(&store, "pipelines/paper-table2.toml", &toy_sets(&model, &train, &bench, &t2, false));
    assert!(s["keys"]["grpo.update[1]"].is_string() && s["keys"].get("grpo.update[2]").is_none(), "repeat shrunk to 2");
    let cells = table_cells(&store, &s);
    assert_eq!(cells.len(), 3 * 4, "{cells:?}");
    for m in ["base", "GRPO", "RREDCoT"] {
        for b in t2 {
            assert!(cells.iter().any(|(_, cm, cb)| cm == m && cb == b), "{m} x {b} in {cells:?}");
        }
    }
    let rows: Vec<EvalRow> = read_rows(&output(&store, &s, "eval_rredcot", "eval"), Schema::Eval).unwrap();
    assert_eq!(rows.len(), 4 * 4 * 2, "4 benchmarks x limit 4 x k 2");

    // Table 1: five benchmarks and the judge ensemble's table next to the verifier's.
    let t1 = ["aime24", "aime25", "aime26", "minerva", "math500"];
    let s = run(&store, "pipelines/paper-table1.toml", &toy_sets(&model, &train_numina, &bench, &t1, true));
    // Its training set has no answer column: every answer came out of its solution's box.
    let imported = &record(&store, &s, "import_train")["counters"];
    assert_eq!((imported["answers_from_boxes"].as_i64(), imported["missing_answer"].as_i64()), (Some(60), Some(0)));
    // The filter finds each boxed answer at its solution's end, so it keeps every row.
    let kept = &record(&store, &s, "train_set")["counters"];
    assert_eq!(kept["kept"].as_i64(), Some(60), "{kept}");
    let cells = table_cells(&store, &s);
    let judge_cells = cells.iter().filter(|(t, _, _)| t.contains("judge")).count();
    assert_eq!((cells.len(), judge_cells), (2 * 3 * 5, 3 * 5), "{cells:?}");
    let judged: Vec<EvalRow> = read_rows(&output(&store, &s, "judge_grpo", "eval"), Schema::Eval).unwrap();
    assert!(judged.iter().all(|r| r.correct_judge.is_some()) && judged.len() == 5 * 4 * 2);
}
