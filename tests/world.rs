//! The default world's stages through the real binary: `pipelines/world-demo.toml` end to end,
//! byte-identical artifacts from two fresh stores, and bad inputs failing with clear messages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_pipeline(store: &Path, pipeline: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    Command::cargo_bin("rredcot")
        .unwrap()
        .current_dir(repo())
        .arg("--store")
        .arg(store)
        .args(["pipeline", "run"])
        .arg(pipeline)
        .args(extra)
        .assert()
}

/// stage -> (output -> content hash, counters) from the run records of a store.
fn records(store: &Path) -> BTreeMap<String, (BTreeMap<String, String>, serde_json::Value)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(store.join("instances")).unwrap() {
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.unwrap().path().join("run.json")).unwrap())
                .unwrap();
        let hashes = rec["outputs"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v["hash"].as_str().unwrap().to_string()))
            .collect();
        out.insert(
            rec["stage"].as_str().unwrap().to_string(),
            (hashes, rec["counters"].clone()),
        );
    }
    out
}

#[test]
fn world_demo_runs_end_to_end_and_is_byte_identical_across_fresh_stores() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let p = repo().join("pipelines/world-demo.toml");
    let small = [
        "--set",
        "taskgen.n_train=300",
        "--set",
        "taskgen.n_eval=30",
        "--set",
        "tokenizer.vocab_size=320",
    ];
    run_pipeline(a.path(), &p, &small).success();
    run_pipeline(b.path(), &p, &small).success();
    let (ra, rb) = (records(a.path()), records(b.path()));
    assert_eq!(
        ra.keys().collect::<Vec<_>>(),
        ["filter_gsm8k", "import_gsm8k", "taskgen", "tokenizer"]
    );
    for (stage, (hashes, _)) in &ra {
        assert_eq!(
            hashes, &rb[stage].0,
            "{stage}: artifact hashes differ between two fresh stores"
        );
    }
    // A different seed changes the generated problems (the hash is not a constant).
    let c = tempfile::tempdir().unwrap();
    run_pipeline(
        c.path(),
        &p,
        &[&small[..], &["--set", "taskgen.seed=1"]].concat(),
    )
    .success();
    assert_ne!(
        records(c.path())["taskgen"].0["train"],
        ra["taskgen"].0["train"]
    );
    // The filter report is in the run record.
    let counters = &ra["filter_gsm8k"].1;
    assert_eq!(counters["input_rows"], 100);
    let removed: i64 = counters
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("removed_"))
        .map(|(_, v)| v.as_i64().unwrap())
        .sum();
    assert_eq!(removed + counters["kept"].as_i64().unwrap(), 100);
    assert_eq!(ra["taskgen"].1["train_rows"], 300);
}

fn write_pipeline(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("p.toml");
    let stages = repo().join("stages");
    std::fs::write(
        &p,
        format!("stage_dirs = [{:?}]\n{body}", stages.display().to_string()),
    )
    .unwrap();
    p
}

#[test]
fn import_of_only_bad_rows_is_an_error_not_an_empty_artifact() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.jsonl"), b"{\"question\": \"caf\xe9\", \"answer\": \"#### 1\"}\n{\"question\": \"\", \"answer\": \"#### 2\"}\n").unwrap();
    let p = write_pipeline(
        dir.path(),
        "[[stage]]\nname = \"imp\"\nuses = \"import\"\ninputs = { source = \"file:bad.jsonl\" }\n",
    );
    let out = run_pipeline(&dir.path().join("store"), &p, &[])
        .failure()
        .get_output()
        .clone();
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("bad.jsonl: no usable rows"), "{err}");
    assert!(
        err.contains("skipped_non_utf8: 1") && err.contains("skipped_no_prompt: 1"),
        "{err}"
    );
}

#[test]
fn mapping_a_missing_column_fails_naming_the_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("d.jsonl"),
        "{\"question\": \"q\", \"answer\": \"1 #### 1\"}\n",
    )
    .unwrap();
    let p = write_pipeline(dir.path(), "[[stage]]\nname = \"imp\"\nuses = \"import\"\ninputs = { source = \"file:d.jsonl\" }\nparams = { layout = \"hf\" }\n");
    let out = run_pipeline(&dir.path().join("store"), &p, &[])
        .failure()
        .get_output()
        .clone();
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("d.jsonl") && err.contains("`problem`"),
        "{err}"
    );
}

#[test]
fn filter_that_removes_everything_fails_with_its_report() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("d.jsonl"),
        "{\"question\": \"q\", \"answer\": \"so 2 #### 3\"}\n",
    )
    .unwrap();
    let p = write_pipeline(
        dir.path(),
        "[[stage]]\nname = \"imp\"\nuses = \"import\"\ninputs = { source = \"file:d.jsonl\" }\n\n[[stage]]\nname = \"f\"\nuses = \"filter\"\ninputs = { prompts = \"imp.prompts\" }\n",
    );
    let out = run_pipeline(&dir.path().join("store"), &p, &[])
        .failure()
        .get_output()
        .clone();
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("filter removed all 1 rows") && err.contains("removed_answer_mismatch 1"),
        "{err}"
    );
}

// Issue 18: no row lost silently. An empty-prompt row (import) and a row whose solution states
// another answer (filter) are each listed with their reason in the stage's `skipped` table, and
// counted on the stage's stderr (its log).
#[test]
fn skipped_and_removed_rows_are_listed_in_the_skipped_tables() {
    use rredcot::artifact::read_table_columns;
    use rredcot::stages::skipped::SkippedRow;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("d.jsonl"),
        concat!(
            "{\"question\": \"What is 1+1?\", \"answer\": \"1 + 1 = 2\\n#### 2\"}\n",
            "{\"question\": \"  \", \"answer\": \"#### 3\"}\n",
            "{\"question\": \"What is 2+2?\", \"answer\": \"2 + 2 = 4\\n#### 5\"}\n",
        ),
    )
    .unwrap();
    let p = write_pipeline(
        dir.path(),
        "[[stage]]\nname = \"imp\"\nuses = \"import\"\ninputs = { source = \"file:d.jsonl\" }\n\n[[stage]]\nname = \"f\"\nuses = \"filter\"\ninputs = { prompts = \"imp.prompts\" }\n",
    );
    let store = dir.path().join("store");
    run_pipeline(&store, &p, &[]).success();
    // A stage's stderr goes to its log in the store.
    let mut logs = String::new();
    for e in std::fs::read_dir(store.join("logs")).unwrap() {
        logs += &std::fs::read_to_string(e.unwrap().path()).unwrap();
    }
    assert!(
        logs.contains("import: skipped 1 rows (skipped_no_prompt 1)")
            && logs.contains("filter: skipped 1 rows (removed_answer_mismatch 1)"),
        "{logs}"
    );
    let mut tables = BTreeMap::new();
    for e in std::fs::read_dir(store.join("instances")).unwrap() {
        let inst = e.unwrap().path();
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(inst.join("run.json")).unwrap()).unwrap();
        let rows: Vec<SkippedRow> = read_table_columns(
            &inst.join("outputs/skipped.parquet"),
            &["stage", "row", "id", "reason", "detail"],
        )
        .unwrap();
        tables.insert(rec["stage"].as_str().unwrap().to_string(), rows);
    }
    let imp = &tables["imp"];
    assert_eq!(imp.len(), 1, "{imp:?}");
    assert_eq!(
        (imp[0].row, imp[0].reason.as_str()),
        (1, "skipped_no_prompt")
    );
    assert!(imp[0].detail.contains("d.jsonl"), "{:?}", imp[0]);
    let f = &tables["f"];
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].reason, "removed_answer_mismatch");
    assert_eq!(f[0].id.as_deref(), Some("d-00002"));
    assert!(f[0].detail.contains("\"5\""), "{:?}", f[0]);
}

/// An imported file's name is part of the key: the rows are named after it (`source`, ids) and
/// its extension picks the parser, so a copy under another name is imported again, not served
/// the first one's rows.
#[test]
fn a_renamed_copy_of_an_imported_file_is_imported_under_its_own_name() {
    let dir = tempfile::tempdir().unwrap();
    let row = "{\"question\": \"What is 1+1?\", \"answer\": \"1 + 1 = 2\\n#### 2\"}\n";
    std::fs::write(dir.path().join("good.jsonl"), row).unwrap();
    std::fs::write(dir.path().join("aime25.jsonl"), row).unwrap();
    let p = write_pipeline(dir.path(), "[[stage]]\nname = \"imp\"\nuses = \"import\"\ninputs = { source = \"file:good.jsonl\" }\n");
    let store = dir.path().join("store");
    run_pipeline(&store, &p, &[]).success();
    let copy = format!("imp.inputs.source=file:{}", dir.path().join("aime25.jsonl").display());
    let status = Command::cargo_bin("rredcot").unwrap().arg("--store").arg(&store).args(["pipeline", "status"]).arg(&p).args(["--set", &copy]).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("input source file name: \"good.jsonl\" -> \"aime25.jsonl\""), "{status}");
    run_pipeline(&store, &p, &["--set", &copy]).success();
    let mut sources = Vec::new();
    for e in std::fs::read_dir(store.join("instances")).unwrap() {
        let rows: Vec<(String, String)> = rredcot::artifact::read_table_columns::<IdSource>(&e.unwrap().path().join("outputs/prompts.parquet"), &["id", "source"])
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.source))
            .collect();
        sources.extend(rows);
    }
    sources.sort();
    assert_eq!(sources, [("aime25-00000".to_string(), "aime25".to_string()), ("good-00000".to_string(), "good".to_string())]);
}

#[derive(serde::Deserialize)]
struct IdSource {
    id: String,
    source: String,
}
