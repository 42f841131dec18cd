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

/// The demo pipeline, run once; returns it and the key of its `double` instance.
fn ran_demo(p: &Project) -> (std::path::PathBuf, String) {
    let pl = p.pipeline("demo", DEMO);
    let s = p.run_ok(&pl, &[]);
    (pl, s["keys"]["double"].as_str().unwrap().to_string())
}

/// Same size, one byte in the middle changed.
fn flip_middle_byte(file: &std::path::Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(file, &bytes).unwrap();
}

#[test]
fn corrupt_artifact_is_detected_by_verify_and_recomputed_by_next_run() {
    let p = Project::new();
    let (pl, key) = ran_demo(&p);
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

    flip_middle_byte(&file);
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

/// Mistakes that would otherwise be read as something else: a carry that wires nothing (every
/// step would read step 0's input), a NaN param (null in the key), an empty `file:` path (the
/// pipeline's folder), names that read as chain steps, a stage folder that is not there.
#[test]
fn plan_mistakes_that_would_run_something_else_are_errors() {
    let p = Project::new();
    let chain = |carry: &str| {
        format!("[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n[[chain]]\nname = \"tr\"\nrepeat = 2\ncarry = {{ {carry} }}\n  [[chain.stage]]\n  name = \"step\"\n  uses = \"demo_step\"\n  inputs = {{ state = \"n.table\" }}\n")
    };
    let err = fails(&p, &p.pipeline("typo", &chain("\"step.stat\" = \"step.state\"")), &[]);
    assert!(err.contains("carry `step.stat`") && err.contains("no input `stat`") && err.contains("state"), "{err}");
    let err = fails(&p, &p.pipeline("other", &chain("\"stepx.state\" = \"step.state\"")), &[]);
    assert!(err.contains("carry `stepx.state`") && err.contains("chain `tr` has no stage `stepx` (its stages: step)"), "{err}");
    // The right carry plans.
    let out = p.run(&["pipeline", "explain", p.pipeline("right", &chain("\"step.state\" = \"step.state\"")).to_str().unwrap(), "tr.step[1]"]);
    assert!(out.status.success() && text(&out.stdout).contains("state (table) <- tr.step[0].state"), "{}{}", text(&out.stdout), text(&out.stderr));

    let ok = p.pipeline("n", "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"d\"\nuses = \"demo_scale\"\ninputs = { table = \"n.table\" }\n");
    for set in ["d.factor=nan", "d.factor=inf", "d.factor=-inf"] {
        let err = fails(&p, &ok, &["--set", set]);
        assert!(err.contains("NaN and infinity are not allowed"), "{set}: {err}");
    }
    let err = fails(&p, &p.pipeline("nan", "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"d\"\nuses = \"demo_scale\"\ninputs = { table = \"n.table\" }\nparams = { factor = nan }\n"), &[]);
    assert!(err.contains("param `factor`") && err.contains("NaN and infinity are not allowed"), "{err}");
    let err = fails(&p, &ok, &["--set", "d.inputs.table=file:"]);
    assert!(err.contains("`file:` names no path"), "{err}");
    // Every missing input file in one error, not one per run.
    let two = p.pipeline("two", "[[stage]]\nname = \"a\"\nuses = \"demo_sum\"\ninputs = { table = \"file:no-a.parquet\" }\n[[stage]]\nname = \"b\"\nuses = \"demo_sum\"\ninputs = { table = \"file:no-b.parquet\" }\n");
    let err = fails(&p, &two, &[]);
    assert!(err.contains("2 input files do not exist") && err.contains("stage `a` input `table`") && err.contains("no-b.parquet"), "{err}");

    for name in ["", "a.b", "s[2]", "two words"] {
        let err = fails(&p, &p.pipeline("names", &format!("[[stage]]\nname = \"{name}\"\nuses = \"demo_numbers\"\n")), &[]);
        assert!(err.contains("is not a stage or chain name"), "{name:?}: {err}");
    }
    let err = fails(&p, &p.pipeline("local", &chain("").replace("name = \"step\"", "name = \"st.ep\"")), &[]);
    assert!(err.contains("`st.ep` is not a stage or chain name"), "{err}");
    let twice = chain("").replace("  [[chain.stage]]", "  [[chain.stage]]\n  name = \"step\"\n  uses = \"demo_step\"\n  inputs = { state = \"n.table\" }\n  [[chain.stage]]").replacen("  name = \"step\"\n  uses = \"demo_step\"\n  inputs = { state = \"n.table\" }\n  [[chain.stage]]\n", "", 0);
    let err = fails(&p, &p.pipeline("twice", &twice), &[]);
    assert!(err.contains("duplicate stage name in its chain"), "{err}");
    let err = fails(&p, &p.write("dirs.toml", "stage_dirs = [\"no-such-dir\"]\n[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\n"), &[]);
    assert!(err.contains("stage_dirs") && err.contains("no-such-dir") && err.contains("is not a directory"), "{err}");
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
    // The command as it ran, said once; the stage's stderr line shown once.
    assert!(err.contains("external command `sh -c 'echo working; echo '\\''something broke: row 17'\\'' >&2; exit 3'`"), "{err}");
    assert_eq!(
        err.matches("something broke: row 17").count(),
        2,
        "once in the log tail, once inside the command: {err}"
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

    // libtorch's errors end in a C++ backtrace: the tail shows the error, not 30 frames.
    p.write("stages/torch_like.toml", "command = \"echo 'Internal torch error: Invalid learning rate: -1' >&2; echo 'Exception raised from AdamW at adamw.h:69 (most recent call first):' >&2; for i in $(seq 0 29); do echo \\\"frame #$i: <unknown function> + 0x1c90d27\\\" >&2; done; exit 1\"\n[outputs]\nout = \"dir\"\n");
    let err = fails(&p, &p.pipeline("torch", "[[stage]]\nname = \"torch_like\"\n"), &[]);
    assert!(err.contains("  | Internal torch error: Invalid learning rate: -1") && !err.contains("  | frame #"), "{err}");
    let log = std::fs::read_dir(p.store().join("logs")).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect::<String>();
    assert!(log.contains("frame #29: <unknown function>"), "the log keeps the frames: {log}");
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
            && err.contains("outputs/prompts.parquet"),
        "{err}"
    );
    // The temp dir is deleted by then: the message names the instance and output, not a tmp path.
    assert!(
        err.contains("(fake)") && !err.contains("store/tmp/"),
        "{err}"
    );
    assert_eq!(p.committed().len(), 1, "only `numbers` is committed");
}

#[test]
fn status_dag_explain_show_and_gc() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let pls = pl.to_str().unwrap();
    p.run_ok(&pl, &["--until", "numbers"]);
    let out = p.run(&["pipeline", "status", pls]);
    let st = text(&out.stdout);
    assert!(
        st.contains("cached   numbers")
            && st.contains("missing  double")
            && st.contains("never run"),
        "{st}"
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
    // Cells are cut to --width characters, saying how long they were.
    let narrow = text(&p.run(&["artifact", "show", &key[..10], "--width", "3"]).stdout);
    assert!(narrow.contains("… (") && narrow.contains(" chars)"), "{narrow}");
    assert!(!show.contains(" chars)"), "short cells are whole: {show}");

    // A second variant leaves instances that the base pipeline no longer references.
    p.run_ok(&pl, &["--set", "numbers.n=20"]);
    let before = p.committed().len();
    // Given the variant's --set, gc keeps the variant's instances instead.
    let gc = p.run(&["artifact", "gc", pls, "--set", "numbers.n=20", "--dry-run"]);
    let said = text(&gc.stdout);
    assert!(gc.status.success() && said.contains(&format!("gc: kept 10, would remove {}", before - 10)), "{said}{}", text(&gc.stderr));
    let gc = p.run(&["artifact", "gc", pls]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(text(&gc.stdout).contains(&format!("gc: kept 10, removed {}", before - 10)), "kept counts the instances kept: {}", text(&gc.stdout));
    assert_eq!(
        p.committed().len(),
        10,
        "gc keeps exactly the current instances (had {before})"
    );
    let s = p.run_ok(&pl, &[]);
    assert!(names(&s, "ran").is_empty());
}

/// gc never removes what a run is about to read: while a run uses the store it refuses, naming
/// why, and removes nothing.
#[test]
fn gc_refuses_while_a_run_uses_the_store() {
    let p = Project::new();
    let pl = slow_demo(&p);
    let other = p.pipeline("other", "[[stage]]\nname = \"n\"\nuses = \"demo_numbers\"\nparams = { n = 3 }\n");
    let mut run = p.cmd(&["pipeline", "run", pl.to_str().unwrap()]).stderr(std::process::Stdio::null()).spawn().unwrap();
    // Until the run has committed its first instance, so it certainly holds the store.
    let t0 = std::time::Instant::now();
    while p.committed().is_empty() {
        assert!(t0.elapsed().as_secs() < 60, "the run committed nothing");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let gc = p.run(&["artifact", "gc", other.to_str().unwrap()]);
    let err = text(&gc.stderr);
    assert!(!gc.status.success() && err.contains("is using the store") && err.contains("run gc when it has ended"), "{err}");
    assert!(run.wait().unwrap().success(), "the run went on to its end");
    assert_eq!(p.committed().len(), 10);
    let gc = p.run(&["artifact", "gc", other.to_str().unwrap()]);
    assert!(gc.status.success() && text(&gc.stdout).contains("gc: kept 0, removed 10"), "{}{}", text(&gc.stdout), text(&gc.stderr));
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

// ---- issue 22: reliability defects found by crash, concurrency and corruption tests ----

/// Whether a process runs (a zombie, dead but not reaped, counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit(')')
            .next()
            .map(|r| !r.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Waits (bounded) for a file to hold a pid.
fn wait_for_pid(path: &std::path::Path) -> i32 {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) for a process to end; kills it if it does not, and says whether it ended.
fn ends(pid: i32) -> bool {
    let t0 = std::time::Instant::now();
    while alive(pid) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survived = alive(pid);
    if survived {
        // SAFETY: cleaning up a process this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    !survived
}

/// An external stage whose command forks a long `sleep` (a grandchild of `stage exec`, as
/// `python` is under `sh -c "python {script} {io}"`) and writes its pid to `params.pidfile`.
fn forking_stage(p: &Project, extra: &str) -> std::path::PathBuf {
    p.write(
        "stages/forker.toml",
        &format!("command = \"sleep 300 & echo $! > '{{params.pidfile}}'; wait\"\n[params]\npidfile = \"\"\n[outputs]\nout = \"dir\"\n{extra}"),
    );
    let pidfile = p.path().join("grandchild.pid");
    p.pipeline(
        "forker",
        &format!(
            "[[stage]]\nname = \"forker\"\nparams = {{ pidfile = \"{}\" }}\n",
            pidfile.display()
        ),
    )
}

#[test]
fn stage_grandchildren_die_with_the_runner_and_with_stage_exec() {
    let p = Project::new();
    let pl = forking_stage(&p, "");
    let pidfile = p.path().join("grandchild.pid");
    let mut runner = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_pid(&pidfile);
    assert!(alive(pid));
    runner.kill().unwrap();
    runner.wait().unwrap();
    assert!(
        ends(pid),
        "the stage's grandchild outlived a SIGKILLed runner"
    );

    // The same for `stage exec` run alone (what a Slurm job runs), SIGKILLed.
    std::fs::remove_file(&pidfile).unwrap();
    let spec = std::fs::read_dir(p.store().join("specs"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .unwrap();
    let key = spec
        .file_name()
        .to_string_lossy()
        .trim_end_matches(".json")
        .to_string();
    let mut exec = p
        .cmd(&["stage", "exec", &key])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_pid(&pidfile);
    exec.kill().unwrap();
    exec.wait().unwrap();
    assert!(
        ends(pid),
        "the stage's grandchild outlived a SIGKILLed `stage exec`"
    );
    assert!(p.committed().is_empty());
}

#[test]
fn a_corrupt_large_input_is_never_read_and_verify_finds_what_was_built_from_it() {
    let p = Project::new();
    // > 4 MiB, so a cache hit checks it only by size and mtime.
    p.write("stages/big.toml", "command = \"yes 0123456789abcdef | head -c 5000000 > '{outputs.out}/big.bin'\"\n[outputs]\nout = \"dir\"\n");
    p.write("stages/checksum.toml", "command = \"cksum < '{inputs.src}/big.bin' > '{outputs.out}/sum.txt'\"\n[inputs]\nsrc = \"dir\"\n[outputs]\nout = \"dir\"\n[params]\nn = 0\n");
    let pl = p.pipeline("big", "[[stage]]\nname = \"big\"\n[[stage]]\nname = \"sum\"\nuses = \"checksum\"\ninputs = { src = \"big.out\" }\n");
    let s = p.run_ok(&pl, &[]);
    let (big, sum) = (
        s["keys"]["big"].as_str().unwrap().to_string(),
        s["keys"]["sum"].as_str().unwrap().to_string(),
    );
    // `stage exec` takes the short key `pipeline run` prints, as `artifact show` does.
    let out = p.run(&["stage", "exec", &sum[..12]]);
    assert!(out.status.success() && text(&out.stderr).contains("already committed"), "{}", text(&out.stderr));
    // A key is hex digits: a path is not looked up.
    let out = p.run(&["stage", "exec", "../../etc"]);
    assert!(!out.status.success() && text(&out.stderr).contains("`../../etc` is not an instance key"), "{}", text(&out.stderr));
    let sum_txt = |key: &str| {
        std::fs::read_to_string(
            p.store()
                .join("instances")
                .join(key)
                .join("outputs/out/sum.txt"),
        )
        .unwrap()
    };
    let good = sum_txt(&sum);

    // Same size, same mtime, one byte changed.
    let file = p
        .store()
        .join("instances")
        .join(&big)
        .join("outputs/out/big.bin");
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[4_000_000] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    // verify: the upstream is corrupt; `sum` re-hashed its input before reading it, so it is fine,
    // unless its record comes from a build that did not (simulated by dropping the flag).
    let out = p.run(&["artifact", "verify"]);
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!("CORRUPT {}", &big[..12])) && !report.contains(&sum[..12]),
        "{report}"
    );
    let rj = p.store().join("instances").join(&sum).join("run.json");
    let mut rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&rj).unwrap()).unwrap();
    assert_eq!(rec["inputs_verified"], true);
    rec.as_object_mut().unwrap().remove("inputs_verified");
    std::fs::write(&rj, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    let out = p.run(&["artifact", "verify"]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        report.contains(&format!("SUSPECT {}", &sum[..12]))
            && report.contains("upstream big")
            && report.contains("1 corrupt, 1 built from"),
        "{report}"
    );

    // A new downstream instance must not compute from the corrupt bytes.
    let err = fails(&p, &pl, &["--set", "sum.n=1"]);
    assert!(
        err.contains("input `src`: upstream big")
            && err.contains("does not match its recorded content hash")
            && err.contains("moved it to"),
        "{err}"
    );
    assert_eq!(
        p.committed().len(),
        1,
        "only `sum` (n=0) is left: nothing was built from the corrupt input and it was moved aside"
    );
    // The rerun recomputes the upstream, then the downstream from good bytes.
    let s = p.run_ok(&pl, &["--set", "sum.n=1"]);
    assert_eq!(names(&s, "ran"), vec!["big", "sum"], "{s}");
    assert_eq!(sum_txt(s["keys"]["sum"].as_str().unwrap()), good);
}

/// Whether `pid` waits for a file lock (a `->` line of /proc/locks).
fn blocked_on_a_lock(pid: u32) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"->") && f.get(5) == Some(&pid.to_string().as_str())
    })
}

#[test]
fn a_corrupt_instance_is_checked_again_under_its_lock_before_quarantine() {
    let p = Project::new();
    let (pl, key) = ran_demo(&p);
    let file = p
        .store()
        .join("instances")
        .join(&key)
        .join("outputs/table.parquet");
    let bytes = std::fs::read(&file).unwrap();
    flip_middle_byte(&file);

    // Another writer holds the instance: the runner finds it corrupt and waits for the lock...
    let lock = std::fs::File::create(p.store().join("locks").join(format!("{key}.lock"))).unwrap();
    lock.lock().unwrap();
    let runner = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !blocked_on_a_lock(runner.id()) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the runner never waited for the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...while that writer puts a good instance in place.
    std::fs::write(&file, &bytes).unwrap();
    drop(lock);
    let out = runner.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        names(&s, "ran").is_empty(),
        "the good instance was recomputed: {s}"
    );
    assert_eq!(names(&s, "reused"), vec!["double"], "{s}");
    assert_eq!(
        std::fs::read_dir(p.store().join("quarantine"))
            .unwrap()
            .count(),
        0,
        "a good instance was quarantined"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("waiting  double") && !err.contains("corrupt  double"),
        "{err}"
    );
}

/// Runs the slow demo in its own process group and sends `sig` to the whole group (as a
/// terminal's Ctrl-C does) once a stage runs; returns (exit code, stderr).
fn signal_the_group(sig: libc::c_int) -> (Option<i32>, String, Project) {
    use std::os::unix::process::CommandExt;
    let p = Project::new();
    let pl = slow_demo(&p);
    let child = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "2"])
        .process_group(0)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(p.store().join("tmp"))
        .map(|d| d.count())
        .unwrap_or(0)
        == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "no stage started");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: signalling the process group of our own child.
    unsafe { libc::kill(-(child.id() as libc::pid_t), sig) };
    let out = child.wait_with_output().unwrap();
    (out.status.code(), text(&out.stderr), p)
}

#[test]
fn ctrl_c_and_sigterm_are_interruptions_not_failures() {
    let (code, err, p) = signal_the_group(libc::SIGINT);
    assert_eq!(code, Some(130), "{err}");
    assert!(
        err.contains("interrupted (SIGINT)")
            && err.contains("pipeline slow interrupted")
            && err.contains(" 0 failed"),
        "{err}"
    );
    assert!(
        !err.contains("FAILED") && !err.contains("killed by signal"),
        "{err}"
    );
    assert_no_half_written_instances(&p);
    let left: Vec<_> = std::fs::read_dir(p.store().join("tmp")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "an interrupted stage's partial outputs go with it: {left:?}");
    let done = p.committed().len();
    let s = p.run_ok(&slow_demo(&p), &[]);
    assert_eq!(names(&s, "ran").len(), 10 - done, "the rerun resumes");

    let (code, err, _) = signal_the_group(libc::SIGTERM);
    assert_eq!(code, Some(143), "{err}");
    assert!(
        err.contains("interrupted (SIGTERM)") && !err.contains("FAILED"),
        "{err}"
    );
}

#[test]
fn a_broken_run_record_is_reported_and_moved_aside() {
    let p = Project::new();
    let (pl, key) = ran_demo(&p);
    let rj = p.store().join("instances").join(&key).join("run.json");
    let bytes = std::fs::read(&rj).unwrap();
    std::fs::write(&rj, &bytes[..bytes.len() / 2]).unwrap();
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("corrupt  double ({})", &key[..12]))
            && err.contains("run.json: not a valid run record")
            && err.contains("moved to"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&s, "ran"), vec!["double"]);
    let q: Vec<_> = std::fs::read_dir(p.store().join("quarantine"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(q.len(), 1);
    let note = std::fs::read_to_string(q[0].path().join("QUARANTINED")).unwrap();
    assert!(
        note.contains("corrupt") && note.contains("run.json") && !note.contains("superseded"),
        "{note}"
    );
}

#[test]
fn a_second_runner_reports_waits_and_reuses_as_such() {
    let p = Project::new();
    let pl = p.pipeline("one", "[[stage]]\nname = \"numbers\"\nuses = \"demo_numbers\"\nparams = { n = 50, sleep_ms = 1500 }\n");
    let pls = pl.to_str().unwrap().to_string();
    let first = p
        .cmd(&["pipeline", "run", &pls, "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Start the second run once the first one's stage is writing.
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(p.store().join("tmp"))
        .map(|d| d.count())
        .unwrap_or(0)
        == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the first run never started its stage"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = p.run(&["pipeline", "run", &pls, "--json"]);
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success() && second.status.success());
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_slice(&first.stdout).unwrap(),
        serde_json::from_slice(&second.stdout).unwrap(),
    );
    assert_eq!(names(&a, "ran"), vec!["numbers"], "{a}");
    assert!(
        names(&b, "ran").is_empty() && names(&b, "cached").is_empty(),
        "{b}"
    );
    assert_eq!(names(&b, "reused"), vec!["numbers"], "{b}");
    assert_eq!(a["counters"]["rows"], 50);
    assert!(
        b["counters"].as_object().unwrap().is_empty(),
        "counters of work done elsewhere: {b}"
    );
    let err = text(&second.stderr);
    assert!(
        err.contains("waiting  numbers")
            && err.contains("reused   numbers")
            && err.contains("0 ran, 0 cached, 1 reused"),
        "{err}"
    );
}

#[test]
fn stages_with_the_same_key_run_once() {
    let p = Project::new();
    let count = p.path().join("executions.txt");
    p.write("stages/once.toml", "command = \"echo x >> '{params.log}'; echo > '{outputs.out}/o'\"\n[params]\nlog = \"\"\n[outputs]\nout = \"dir\"\n");
    let body = format!("[[stage]]\nname = \"a\"\nuses = \"once\"\nparams = {{ log = \"{0}\" }}\n[[stage]]\nname = \"b\"\nuses = \"once\"\nparams = {{ log = \"{0}\" }}\n", count.display());
    let s = p.run_ok(&p.pipeline("twins", &body), &["-j", "2"]);
    assert_eq!(s["keys"]["a"], s["keys"]["b"]);
    assert_eq!(
        std::fs::read_to_string(&count).unwrap().lines().count(),
        1,
        "executed once"
    );
    assert_eq!(names(&s, "ran").len(), 1, "{s}");
    assert_eq!(names(&s, "reused").len(), 1, "{s}");
}

#[test]
fn leftovers_of_interrupted_writes_are_cleaned() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    p.run_ok(&pl, &[]);
    // A pid that is surely gone: a child we started and reaped.
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    let leftover = |rel: String| {
        let f = p.write(&rel, "partial");
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old)
            .unwrap();
        f
    };
    let spec_tmp = leftover(format!("store/specs/{}.tmp.{dead}", "a".repeat(64)));
    let refs_tmp = leftover(format!("store/refs/demo.tmp.{dead}"));
    // A write in progress: its writer (this test) is alive.
    let live = leftover(format!("store/refs/other.tmp.{}", std::process::id()));
    let tmp_dir = p
        .store()
        .join("tmp")
        .join(format!("{}.{dead}", "b".repeat(64)));
    std::fs::create_dir_all(tmp_dir.join("outputs")).unwrap();
    p.run_ok(&pl, &[]);
    assert!(
        !spec_tmp.exists() && !refs_tmp.exists(),
        "stale *.tmp.<pid> files were kept"
    );
    assert!(!tmp_dir.exists(), "a stale tmp/<key>.<pid>/ was kept");
    assert!(live.exists(), "the file of a live writer was removed");
}

#[test]
fn a_local_time_limit_kills_a_hanging_stage() {
    let p = Project::new();
    let pl = forking_stage(&p, "[resources]\ntime = \"0:01\"\n");
    let pidfile = p.path().join("grandchild.pid");
    let mut child = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let grandchild = wait_for_pid(&pidfile);
    // Bounded wait: without the limit the run would hang for the sleep's 300 s.
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        child.kill().unwrap();
        let _ = ends(grandchild);
        panic!("the run ignored resources.time");
    }
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("FAILED   forker")
            && err.contains("time limit resources.time = \"0:01\" (1s)"),
        "{err}"
    );
    assert!(
        ends(grandchild),
        "the stage's processes outlived its time limit"
    );
    assert!(p.committed().is_empty(), "nothing cached");
    assert_eq!(
        std::fs::read_dir(p.store().join("tmp")).unwrap().count(),
        0,
        "temp output removed"
    );
}

#[test]
fn read_only_commands_never_create_a_store() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let pls = pl.to_str().unwrap();
    for args in [
        vec!["pipeline", "status", pls],
        vec!["report", pls, "--stage", "final"],
        vec!["artifact", "verify"],
        vec!["artifact", "show", "abc"],
        vec!["artifact", "gc", pls, "--dry-run"],
    ] {
        let out = p.run(&args);
        let err = text(&out.stderr);
        assert!(
            !out.status.success() && err.contains(&format!("no store at {}", p.store().display())),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one error line: {err}");
    }
    // These still answer on a store that does not exist, without creating it.
    let out = p.run(&["pipeline", "explain", pls, "numbers"]);
    assert!(
        out.status.success() && text(&out.stdout).contains("not cached"),
        "{}",
        text(&out.stderr)
    );
    let out = p.run(&["pipeline", "run", pls, "--dry-run"]);
    assert!(
        out.status.success() && text(&out.stdout).contains("would run  numbers: never run"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains(" ran, "), "a dry run prints no run summary: {}", text(&out.stderr));
    assert!(!p.store().exists(), "a read-only command created the store");
}

/// `--set '*.PARAM=…'` and `'*.inputs.NAME=…'` reach every stage that has the param or input
/// (one model path for a whole pipeline), and nothing else.
#[test]
fn a_set_on_every_stage_reaches_the_stages_that_have_it() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let pls = pl.to_str().unwrap();
    let explain = |stage: &str, set: &str| text(&p.run(&["pipeline", "explain", pls, stage, "--set", set]).stdout);
    // demo_scale's `sleep_ms` (both scalings), and demo_numbers' own.
    for stage in ["double", "triple", "numbers"] {
        assert!(explain(stage, "*.sleep_ms=7").contains("sleep_ms = 7  (--set)"), "{stage}");
    }
    assert!(explain("double", "*.factor=5").contains("factor = 5.0  (--set)"));
    assert!(explain("numbers", "*.factor=5").lines().all(|l| !l.contains("factor")), "numbers has no factor");
    p.write("t.parquet", "");
    let ex = explain("double", "*.inputs.table=file:t.parquet");
    assert!(ex.contains("table (table) <- file:") && ex.contains("t.parquet"), "{ex}");
    let out = p.run(&["pipeline", "explain", pls, "double", "--set", "*.no_such=1"]);
    assert!(!out.status.success() && text(&out.stderr).contains("has a param `no_such`"), "{}", text(&out.stderr));
}

/// The run's summary line names each counter with its stage kind: one name counts different
/// things in different kinds, so a sum across kinds would mislead.
#[test]
fn the_summary_line_names_counters_by_stage_kind() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap()]);
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(out.status.success() && last.contains(" demo_numbers.rows=200") && last.contains(" demo_step.steps="), "{last}");
}

/// `serve --pipeline` looks the stage up in the variant a run's `--set` made; `--set` needs it.
#[test]
fn serve_takes_the_runs_set_with_its_pipeline() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let out = p.run(&["serve", "--pipeline", pl.to_str().unwrap(), "--model", "numbers", "--set", "zz.n=1"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("zz.n=1") && err.contains("no stage `zz`"), "the --set reached the plan: {err}");
    let out = p.run(&["serve", "--model", "x", "--set", "numbers.n=1"]);
    assert!(!out.status.success() && text(&out.stderr).contains("--pipeline"), "{}", text(&out.stderr));
}

/// `serve` refuses at start what would fail every request (no token to sample, no slot).
#[test]
fn serve_refuses_zero_tokens_or_slots_before_loading_anything() {
    let p = Project::new();
    for flag in ["--max-new-tokens", "--max-batch"] {
        let out = p.run(&["serve", "--model", "no-such-model", flag, "0"]);
        let err = text(&out.stderr);
        assert!(!out.status.success() && err.contains(flag) && err.contains("0 is not in 1.."), "{flag}: {err}");
    }
}

#[test]
fn a_missing_file_is_reported_once() {
    let p = Project::new();
    let out = p.run(&["pipeline", "run", "no-such-pipeline.toml"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert!(err.contains("no-such-pipeline.toml"), "{err}");
}

/// A pipeline's `resources = { cpus = 1 }` on a use of a 2-CPU kind lets two such stages run side
/// by side under `-j 2` (without it they take turns), and leaves the instance keys as they were.
#[test]
fn a_pipeline_can_give_a_stage_fewer_cpus_than_its_kind() {
    let p = Project::new();
    p.write(
        "stages/two_cpu.toml",
        "command = \"start=$(date +%s%N); sleep 0.6; echo \\\"$start $(date +%s%N)\\\" > {outputs.out}/span.txt\"\n[outputs]\nout = \"dir\"\n[params]\ntag = 0\n[resources]\ncpus = 2\n",
    );
    let spans_of = |name: &str, over: &str| {
        let mut body = String::new();
        for i in 0..2 {
            body.push_str(&format!("[[stage]]\nname = \"s{i}\"\nuses = \"two_cpu\"\nparams = {{ tag = {i} }}\n{over}"));
        }
        let pl = p.pipeline(name, &body);
        let out = p.cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "2", "--json", "--force", "s0", "--force", "s1"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut spans = Vec::new();
        let mut keys = Vec::new();
        for i in 0..2 {
            let key = s["keys"][format!("s{i}")].as_str().unwrap().to_string();
            let line = std::fs::read_to_string(p.store().join("instances").join(&key).join("outputs/out/span.txt")).unwrap();
            let f: Vec<u128> = line.split_whitespace().map(|x| x.parse().unwrap()).collect();
            spans.push((f[0], f[1]));
            keys.push(key);
        }
        spans.sort();
        (spans[1].0 < spans[0].1, keys)
    };
    let (overlap, keys) = spans_of("kind_cpus", "");
    assert!(!overlap, "two 2-CPU stages ran side by side under -j 2");
    let (overlap, keys_over) = spans_of("one_cpu", "resources = { cpus = 1 }\n");
    assert!(overlap, "stages given 1 CPU each did not run side by side under -j 2");
    assert_eq!(keys, keys_over, "resources are not part of the instance key");
    // A misspelt entry is an error naming it.
    let pl = p.pipeline("typo", "[[stage]]\nname = \"s0\"\nuses = \"two_cpu\"\nresources = { cpu = 1 }\n");
    let out = p.cmd(&["pipeline", "run", pl.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("cpu"), "{}", text(&out.stderr));
}

#[test]
fn a_relative_store_works_for_external_commands_run_in_their_stage_directory() {
    let p = Project::new();
    p.write("stages/hello.toml", "command = \"echo hi > '{outputs.out}/x.txt'\"\n[outputs]\nout = \"dir\"\n");
    let pl = p.pipeline("rel", "[[stage]]\nname = \"hello\"\n");
    // The default store (.rredcot/store) and one named by a relative path, from the project.
    for store in [None, Some("relstore")] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rredcot"));
        if let Some(s) = store {
            cmd.args(["--store", s]);
        }
        let out = cmd.args(["pipeline", "run", pl.to_str().unwrap()]).current_dir(p.path()).env_remove("RREDCOT_STORE").output().unwrap();
        assert!(out.status.success(), "{store:?}: {}", text(&out.stderr));
        let root = p.path().join(store.unwrap_or(".rredcot/store"));
        let hits: Vec<_> = std::fs::read_dir(root.join("instances")).unwrap().flatten().filter(|e| e.path().join("outputs/out/x.txt").is_file()).collect();
        assert_eq!(hits.len(), 1, "{store:?}");
    }
}

#[test]
fn set_takes_params_as_the_file_writes_them_and_an_unknown_stage_is_told_the_stages() {
    let p = Project::new();
    let pl = p.pipeline("d", common::DEMO);
    let s0 = p.run_ok(&pl, &[]);
    assert!(names(&s0, "ran").contains(&"double".to_string()), "{s0}");
    // `STAGE.params.NAME`, as the file writes `params = { … }`, is `STAGE.NAME`: the same keys.
    let s1 = p.run_ok(&pl, &["--set", "double.params.factor=5", "--set", "train.step.params.decay=0.2"]);
    let ran = names(&s1, "ran");
    assert!(ran.contains(&"double".to_string()) && ran.contains(&"train.step[0]".to_string()), "{s1}");
    let s2 = p.run_ok(&pl, &["--set", "double.factor=5", "--set", "train.step.decay=0.2"]);
    assert!(names(&s2, "ran").is_empty(), "{s2}");

    let stages = "its stages: numbers, double, triple, sum_double, sum_triple, final, train.step";
    for args in [["--set", "dubble.factor=5"], ["--set", "dubble.uses=demo_sum"], ["--until", "dubble"], ["--force", "dubble"]] {
        let err = fails(&p, &pl, &args);
        assert!(err.contains("`dubble`") && err.contains(stages), "{args:?}: {err}");
    }
    let err = fails(&p, &pl, &["--set", "double.params.bogus=1"]);
    assert!(err.contains("has no param `bogus`"), "{err}");
}
