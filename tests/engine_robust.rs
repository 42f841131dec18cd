//! Robustness through the real binary: SIGKILL at random points, two runs on one store,
//! corrupt artifacts, and every kind of bad input (clear error, exit != 0, nothing half-written).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{names, text, Project, DEMO};
use rand::{Rng, SeedableRng};

/// The demo pipeline with every stage slowed down so a kill lands mid-run.
fn slow_demo(p: &Project) -> std::path::PathBuf {
    let body = DEMO
        .replace(
            "params = { n = 200, seed = 7 }",
            "params = { n = 200, seed = 7, sleep_ms = 60 }",
        )
        .replace(
            "params = { factor = 2.0 }",
            "params = { factor = 2.0, sleep_ms = 60 }",
        )
        .replace(
            "params = { factor = 3.0 }",
            "params = { factor = 3.0, sleep_ms = 60 }",
        )
        .replace(
            "inputs = { state = \"sum_double.table\" }",
            "inputs = { state = \"sum_double.table\" }\n  params = { sleep_ms = 60 }",
        );
    p.pipeline("slow", &body)
}

fn run_records(p: &Project) -> BTreeMap<String, Vec<u8>> {
    p.committed()
        .into_iter()
        .map(|k| {
            let bytes =
                std::fs::read(p.store().join("instances").join(&k).join("run.json")).unwrap();
            (k, bytes)
        })
        .collect()
}

fn assert_no_half_written_instances(p: &Project) {
    for e in std::fs::read_dir(p.store().join("instances"))
        .unwrap()
        .flatten()
    {
        assert!(
            e.path().join("run.json").is_file(),
            "instance dir without run record: {}",
            e.path().display()
        );
    }
}

#[test]
fn sigkill_at_random_points_loses_only_unfinished_instances() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20261123);
    let p = Project::new();
    let pl = slow_demo(&p);
    let pls = pl.to_str().unwrap();
    let total = 10;
    for trial in 0..20 {
        // Fresh work each trial (new seed => new keys for every instance).
        let seed = format!("numbers.seed={trial}");
        let mut child = p
            .cmd(&["pipeline", "run", pls, "-j", "2", "--set", &seed])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..900)));
        child.kill().unwrap();
        child.wait().unwrap();
        // Children die with the runner (PDEATHSIG); give the kernel a moment.
        std::thread::sleep(Duration::from_millis(50));
        assert_no_half_written_instances(&p);
        let before = run_records(&p);
        let s = p.run_ok(&pl, &["-j", "2", "--set", &seed]);
        let ran = names(&s, "ran").len();
        let cached = names(&s, "cached").len();
        assert_eq!(
            ran + cached,
            total,
            "trial {trial}: every instance ends up done: {s}"
        );
        // Nothing finished before the kill was recomputed: its run record is byte-identical.
        let after = run_records(&p);
        for (k, bytes) in &before {
            assert_eq!(
                after.get(k),
                Some(bytes),
                "trial {trial}: finished instance {k} was recomputed or lost"
            );
        }
        assert_eq!(
            after.len(),
            before.len() + ran,
            "trial {trial}: ran exactly the unfinished instances"
        );
    }
    let out = p.run(&["artifact", "verify"]);
    assert!(
        out.status.success(),
        "verify after crashes: {}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("0 corrupt"));
}

#[test]
fn two_concurrent_runs_on_one_store_agree() {
    let p = Project::new();
    let pl = slow_demo(&p);
    let pls = pl.to_str().unwrap().to_string();
    let spawn = |p: &Project| {
        p.cmd(&["pipeline", "run", &pls, "--json", "-j", "2"])
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(&p), spawn(&p));
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(oa.status.success() && ob.status.success());
    let sa: serde_json::Value = serde_json::from_slice(&oa.stdout).unwrap();
    let sb: serde_json::Value = serde_json::from_slice(&ob.stdout).unwrap();
    assert_eq!(
        sa["keys"], sb["keys"],
        "both runs resolve the same instances"
    );
    assert_eq!(p.committed().len(), 10);
    assert_no_half_written_instances(&p);
    let out = p.run(&["artifact", "verify"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn corrupt_artifact_is_detected_by_verify_and_recomputed_by_next_run() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let s = p.run_ok(&pl, &[]);
    let key = s["keys"]["double"].as_str().unwrap().to_string();
    let file = p
        .store()
        .join("instances")
        .join(&key)
        .join("outputs/table.parquet");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();

    let out = p.run(&["artifact", "verify"]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    assert!(
        report.contains(&key[..12]) && report.contains("1 corrupt"),
        "{report}"
    );

    // Same size, edited bytes: caught by the next run's re-hash of small files.
    let s2 = p.run_ok(&pl, &[]);
    assert_eq!(
        names(&s2, "ran"),
        vec!["double"],
        "only the corrupt instance is recomputed: {s2}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        bytes,
        "recomputed bytes equal the original"
    );
    assert_eq!(
        std::fs::read_dir(p.store().join("quarantine"))
            .unwrap()
            .count(),
        1,
        "the corrupt copy is kept aside"
    );

    let mut edited = bytes.clone();
    let mid = edited.len() / 2;
    edited[mid] ^= 0xff;
    std::fs::write(&file, &edited).unwrap();
    let s3 = p.run_ok(&pl, &[]);
    assert_eq!(names(&s3, "ran"), vec!["double"]);
    assert!(p.run(&["artifact", "verify"]).status.success());
}

/// Runs a pipeline that must fail; returns stderr. Checks exit code and that nothing is half-written.
fn fails(p: &Project, pipeline: &std::path::Path, extra: &[&str]) -> String {
    let mut args = vec!["pipeline", "run", pipeline.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = p.run(&args);
    assert!(
        !out.status.success(),
        "expected failure, got success: {}",
        text(&out.stderr)
    );
    if p.store().join("instances").is_dir() {
        assert_no_half_written_instances(p);
    }
    text(&out.stderr)
}

#[test]
fn broken_toml_names_file_line_and_column() {
    let p = Project::new();
    let pl = p.pipeline(
        "broken",
        "[[stage]]\nname = \"numbers\"\nuses = demo_numbers\n",
    );
    let err = fails(&p, &pl, &[]);
    assert!(
        err.contains("broken.toml") && err.contains("line 4, column 8"),
        "{err}"
    );
}

#[test]
fn unknown_kind_missing_output_cycle_and_bad_params_are_clear_errors() {
    let p = Project::new();
    let err = fails(
        &p,
        &p.pipeline("a", "[[stage]]\nname = \"x\"\nuses = \"no_such_kind\"\n"),
        &[],
    );
    assert!(
        err.contains("unknown stage kind `no_such_kind`") && err.contains("demo_numbers"),
        "{err}"
    );

    let err = fails(&p, &p.pipeline("b", "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"s\"\nuses = \"demo_sum\"\ninputs = { table = \"n.nope\" }\n"), &[]);
    assert!(
        err.contains("stage `n` has no output `nope`") && err.contains("table"),
        "{err}"
    );

    let cyc = "[[stage]]\nname = \"a\"\nuses = \"demo_sum\"\ninputs = { table = \"c.table\" }\n[[stage]]\nname = \"b\"\nuses = \"demo_sum\"\ninputs = { table = \"a.table\" }\n[[stage]]\nname = \"c\"\nuses = \"demo_sum\"\ninputs = { table = \"b.table\" }\n";
    let err = fails(&p, &p.pipeline("c", cyc), &[]);
    assert!(
        err.contains("cycle: ")
            && err.contains("a -> b")
            && err.contains("b -> c")
            && err.contains("c -> a"),
        "{err}"
    );

    let err = fails(
        &p,
        &p.pipeline(
            "d",
            "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\nparams = { n = \"many\" }\n",
        ),
        &[],
    );
    assert!(
        err.contains("param `n`") && err.contains("expected integer, got string"),
        "{err}"
    );

    let ok = p.pipeline("e", "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n");
    let err = fails(&p, &ok, &["--set", "n.n=1.5"]);
    assert!(
        err.contains("--set n.n=1.5") && err.contains("expected integer, got float"),
        "{err}"
    );
    let err = fails(&p, &ok, &["--set", "n.bogus=1"]);
    assert!(err.contains("has no param `bogus`"), "{err}");
    let err = fails(&p, &ok, &["--set", "zz.n=1"]);
    assert!(err.contains("no stage `zz`"), "{err}");
    assert!(p.committed().is_empty(), "nothing ran");
}

#[test]
fn failing_external_command_shows_stderr_tail_and_caches_nothing() {
    let p = Project::new();
    p.write("stages/boom.toml", "command = \"echo working; echo 'something broke: row 17' >&2; exit 3\"\n[outputs]\nout = \"dir\"\n");
    let pl = p.pipeline("boom", "[[stage]]\nname = \"boom\"\n");
    let err = fails(&p, &pl, &[]);
    assert!(
        err.contains("FAILED   boom")
            && err.contains("something broke: row 17")
            && err.contains("exit status: 3"),
        "{err}"
    );
    assert!(p.committed().is_empty());
    assert_eq!(
        std::fs::read_dir(p.store().join("tmp")).unwrap().count(),
        0,
        "temp output removed"
    );
    // The next run tries again (not cached).
    let err = fails(&p, &pl, &[]);
    assert!(err.contains("FAILED   boom"), "{err}");
}

#[test]
fn external_output_missing_a_declared_column_is_a_schema_error() {
    let p = Project::new();
    // Copies a generic table where the stage declares a `prompts` artifact.
    p.write("stages/fake_prompts.toml", "command = [\"cp\", \"{inputs.table}\", \"{outputs.prompts}\"]\n[inputs]\ntable = \"table\"\n[outputs]\nprompts = \"prompts\"\n");
    let pl = p.pipeline("fake", "[[stage]]\nname = \"numbers\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"fake\"\nuses = \"fake_prompts\"\ninputs = { table = \"numbers.table\" }\n");
    let err = fails(&p, &pl, &[]);
    assert!(
        err.contains("does not match schema `prompts`")
            && err.contains("missing column `id`")
            && err.contains("prompts.parquet"),
        "{err}"
    );
    assert_eq!(p.committed().len(), 1, "only `numbers` is committed");
}

#[test]
fn status_dag_explain_show_and_gc() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let pls = pl.to_str().unwrap();
    let out = p.run(&["pipeline", "status", pls]);
    assert!(
        text(&out.stdout).contains("missing  numbers") && text(&out.stdout).contains("never run"),
        "{}",
        text(&out.stdout)
    );
    p.run_ok(&pl, &[]);
    let out = p.run(&["pipeline", "status", pls, "--set", "numbers.n=50"]);
    let st = text(&out.stdout);
    assert!(
        st.contains("stale    numbers") && st.contains("param n: 200 -> 50"),
        "{st}"
    );
    assert!(st.contains("upstream `numbers` is not up to date"), "{st}");

    let out = p.run(&[
        "pipeline",
        "run",
        pls,
        "--dry-run",
        "--set",
        "triple.factor=9",
    ]);
    let dr = text(&out.stdout);
    assert!(
        dr.contains("would run  triple: param factor: 3.0 -> 9.0") && dr.contains("2 would run"),
        "{dr}"
    );

    let dot = text(&p.run(&["pipeline", "dag", pls, "--format", "dot"]).stdout);
    assert!(
        dot.starts_with("digraph") && dot.contains("\"train.step[0]\" -> \"train.step[1]\""),
        "{dot}"
    );

    let ex = text(
        &p.run(&[
            "pipeline",
            "explain",
            pls,
            "double",
            "--set",
            "double.digits=3",
        ])
        .stdout,
    );
    assert!(
        ex.contains("factor = 2.0  (pipeline)")
            && ex.contains("digits = 3  (--set)")
            && ex.contains("sleep_ms = 0  (default)"),
        "{ex}"
    );

    let s = p.run_ok(&pl, &[]);
    let key = s["keys"]["numbers"].as_str().unwrap();
    let show = text(&p.run(&["artifact", "show", &key[..10]]).stdout);
    assert!(
        show.contains("200 rows") && show.contains("x: Float64"),
        "{show}"
    );

    // A second variant leaves instances that the base pipeline no longer references.
    p.run_ok(&pl, &["--set", "numbers.n=20"]);
    let before = p.committed().len();
    let gc = p.run(&["artifact", "gc", pls]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert_eq!(
        p.committed().len(),
        10,
        "gc keeps exactly the current instances (had {before})"
    );
    let s = p.run_ok(&pl, &[]);
    assert!(names(&s, "ran").is_empty());
}

#[test]
fn gpu_stages_never_share_a_device() {
    let p = Project::new();
    // Each stage records its device and the time span it held it.
    p.write(
        "stages/gpu_job.toml",
        "command = \"start=$(date +%s%N); sleep 0.3; echo \\\"$CUDA_VISIBLE_DEVICES $start $(date +%s%N)\\\" > {outputs.out}/span.txt\"\n[outputs]\nout = \"dir\"\n[params]\ntag = 0\n[resources]\ngpus = 1\n",
    );
    let mut body = String::new();
    for i in 0..3 {
        body.push_str(&format!(
            "[[stage]]\nname = \"g{i}\"\nuses = \"gpu_job\"\nparams = {{ tag = {i} }}\n"
        ));
    }
    let pl = p.pipeline("gpus", &body);
    let out = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "4", "--json"])
        .env("RREDCOT_GPUS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut spans: Vec<(u128, u128)> = Vec::new();
    for i in 0..3 {
        let key = s["keys"][format!("g{i}")].as_str().unwrap();
        let line = std::fs::read_to_string(
            p.store()
                .join("instances")
                .join(key)
                .join("outputs/out/span.txt"),
        )
        .unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], "0", "the stage was given device 0: {line}");
        spans.push((f[1].parse().unwrap(), f[2].parse().unwrap()));
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "two GPU stages overlapped on one device: {spans:?}"
        );
    }
}

#[test]
fn ctrl_c_stops_cleanly_and_the_rerun_resumes() {
    let p = Project::new();
    let pl = slow_demo(&p);
    let child = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "1"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("interrupted"),
        "{}",
        text(&out.stderr)
    );
    assert_no_half_written_instances(&p);
    let done = p.committed().len();
    assert!(done < 10, "interrupted before the end");
    let s = p.run_ok(&pl, &[]);
    assert_eq!(names(&s, "ran").len(), 10 - done);
}
