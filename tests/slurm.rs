//! `--executor slurm` against a real Slurm cluster: the one `sinfo` reaches, or (as root) a
//! one-node cluster started by `tests/slurm/start-local-cluster.sh`. Without either the tests
//! that need a cluster print SKIP and pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rredcot");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[derive(Debug)]
struct Cluster {
    /// The local test cluster (with its 1-minute `short` partition) is up.
    ours: bool,
}

fn sinfo_partitions() -> Option<Vec<String>> {
    let out = Command::new("sinfo")
        .args(["-h", "-o", "%R"])
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    })
}

/// The cluster, started once per test binary; None (with the reason printed) when there is none.
fn cluster(test: &str) -> Option<&'static Cluster> {
    static C: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let c = C.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            let t0 = Instant::now();
            let st = Command::new("bash")
                .arg(Path::new(ROOT).join("tests/slurm/start-local-cluster.sh"))
                .status()
                .map_err(|e| format!("cannot run start-local-cluster.sh: {e}"))?;
            eprintln!("start-local-cluster.sh: {st} after {:.1}s", t0.elapsed().as_secs_f64());
            // Root must be able to start the cluster: CI runs this as root and must not skip.
            assert!(st.success(), "tests/slurm/start-local-cluster.sh failed ({st}) although running as root");
        }
        match sinfo_partitions() {
            Some(parts) => Ok(Cluster { ours: parts.iter().any(|p| p == "short") && root }),
            None => Err("no Slurm cluster: `sinfo` does not answer and not root, so the local test cluster cannot be started \
                         (run `sudo tests/slurm/start-local-cluster.sh`)"
                .into()),
        }
    });
    match c {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("SKIP {test}: {why}");
            None
        }
    }
}

fn rredcot(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .current_dir(ROOT)
        .env_remove("RREDCOT_SLURM_PROFILE");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run rredcot")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write(path: &Path, s: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, s).unwrap();
}

/// instance name -> key, from `pipeline run --json`.
fn keys_of(o: &Output) -> BTreeMap<String, String> {
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("summary JSON: {e}\n{}", text(o)));
    serde_json::from_value(v["keys"].clone()).unwrap()
}

/// key -> output name -> content hash, from each instance's run.json.
fn hashes(
    store: &Path,
    keys: &BTreeMap<String, String>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    keys.values()
        .map(|k| {
            let rec: Value = serde_json::from_slice(
                &std::fs::read(store.join("instances").join(k).join("run.json")).unwrap(),
            )
            .unwrap();
            let outs = rec["outputs"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(n, o)| (n.clone(), o["hash"].as_str().unwrap().to_string()))
                .collect();
            (k.clone(), outs)
        })
        .collect()
}

fn fast_profile(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("profile.toml");
    write(&p, &format!("poll_interval_s = 0.3\n{extra}"));
    p
}

#[test]
fn slurm_run_matches_local_run() {
    let Some(_) = cluster("slurm_run_matches_local_run") else {
        return;
    };
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (s_slurm, s_local) = (dir.path().join("slurm"), dir.path().join("local"));
    let profile = fast_profile(dir.path(), "");
    let pipeline = "pipelines/engine-demo.toml";
    let a = rredcot(
        &[
            "--store",
            s_slurm.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline,
            "--executor",
            "slurm",
            "--profile",
            profile.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(a.status.success(), "slurm run failed\n{}", text(&a));
    let b = rredcot(
        &[
            "--store",
            s_local.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline,
            "--json",
        ],
        &[],
    );
    assert!(b.status.success(), "local run failed\n{}", text(&b));
    let (ka, kb) = (keys_of(&a), keys_of(&b));
    assert_eq!(
        ka, kb,
        "instance keys differ between the Slurm and the local run"
    );
    assert_eq!(ka.len(), 10);
    assert_eq!(
        hashes(&s_slurm, &ka),
        hashes(&s_local, &kb),
        "artifact hashes differ"
    );
    // Every instance ran as a Slurm job, and double/triple (same kind and resources) as one array.
    let job_of = |inst: &str| {
        let log = std::fs::read_to_string(s_slurm.join("logs").join(format!("{}.log", ka[inst])))
            .unwrap();
        let line = log
            .lines()
            .find(|l| l.starts_with("rredcot: Slurm job "))
            .unwrap_or_else(|| panic!("{inst}: no job line in {log}"))
            .to_string();
        line.split_whitespace().nth(3).unwrap().to_string()
    };
    let (jd, jt) = (job_of("double"), job_of("triple"));
    assert_ne!(jd, jt, "array tasks have their own job ids");
    let v: Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["ran"].as_array().unwrap().len(), 10, "{v}");
    // Slurm's own output files are folded into the instance logs.
    let leftovers: Vec<_> = std::fs::read_dir(s_slurm.join("logs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("slurm-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A second run submits nothing (all cached).
    let c = rredcot(
        &[
            "--store",
            s_slurm.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline,
            "--executor",
            "slurm",
            "--profile",
            profile.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(c.status.success(), "{}", text(&c));
    let v: Value = serde_json::from_slice(&c.stdout).unwrap();
    assert_eq!(v["cached"].as_array().unwrap().len(), 10, "{v}");
    eprintln!(
        "slurm_run_matches_local_run: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

/// A pipeline with one external stage that sleeps for 5 minutes while `marker` exists (the marker
/// is not part of the key, so removing it lets a rerun finish the same instance).
fn slow_pipeline(dir: &Path, marker: &Path, time: &str) -> PathBuf {
    write(
        &dir.join("stages/slow.toml"),
        &format!(
            "description = \"sleeps while a marker file exists\"\n\
             command = \"if [ -e {m} ]; then echo sleeping; sleep 300; fi; echo done > {{outputs.out}}/done.txt\"\n\
             [outputs]\nout = \"dir\"\n[resources]\ntime = \"{time}\"\n",
            m = marker.display()
        ),
    );
    let p = dir.join("pipelines/slow.toml");
    write(&p, "[[stage]]\nname = \"slow\"\nuses = \"slow\"\n");
    p
}

#[test]
fn slurm_time_limit_is_reported_and_rerun_completes() {
    let Some(c) = cluster("slurm_time_limit_is_reported_and_rerun_completes") else {
        return;
    };
    if !c.ours {
        eprintln!("SKIP slurm_time_limit_is_reported_and_rerun_completes: needs the local test cluster's `short` partition");
        return;
    }
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let marker = dir.path().join("marker");
    write(&marker, "");
    let pipeline = slow_pipeline(dir.path(), &marker, "1");
    let profile = fast_profile(dir.path(), "partition = \"short\"\n");
    let args = [
        "--store",
        store.to_str().unwrap(),
        "pipeline",
        "run",
        pipeline.to_str().unwrap(),
        "--executor",
        "slurm",
        "--profile",
        profile.to_str().unwrap(),
        "--json",
    ];
    let a = rredcot(&args, &[]);
    let out = text(&a);
    assert_eq!(a.status.code(), Some(1), "{out}");
    assert!(
        out.contains("ended TIMEOUT") && out.contains("reason TimeLimit"),
        "no TIMEOUT with its reason:\n{out}"
    );
    assert!(out.contains("left incomplete"), "{out}");
    assert!(out.contains("sleeping"), "the log tail is shown:\n{out}");
    let key = keys_of(&a)["slow"].clone();
    assert!(
        !store.join("instances").join(&key).join("run.json").exists(),
        "a timed-out instance must not be committed"
    );
    eprintln!("timeout reported after {:.1}s", t0.elapsed().as_secs_f64());
    std::fs::remove_file(&marker).unwrap();
    let b = rredcot(&args, &[]);
    assert!(b.status.success(), "{}", text(&b));
    let v: Value = serde_json::from_slice(&b.stdout).unwrap();
    assert_eq!(v["ran"], serde_json::json!(["slow"]), "{v}");
    assert_eq!(
        keys_of(&b)["slow"],
        key,
        "the rerun completes the same instance"
    );
    assert!(store.join("instances").join(&key).join("run.json").exists());
    eprintln!(
        "slurm_time_limit_is_reported_and_rerun_completes: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn slurm_ctrl_c_cancels_jobs() {
    let Some(_) = cluster("slurm_ctrl_c_cancels_jobs") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let marker = dir.path().join("marker");
    write(&marker, "");
    let pipeline = slow_pipeline(dir.path(), &marker, "10");
    let profile = fast_profile(dir.path(), "");
    let child = Command::new(BIN)
        .args([
            "--store",
            store.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline.to_str().unwrap(),
            "--executor",
            "slurm",
            "--profile",
            profile.to_str().unwrap(),
        ])
        .env_remove("RREDCOT_SLURM_PROFILE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the job runs (its log says so), then interrupt the run.
    let t0 = Instant::now();
    let job = loop {
        let found = std::fs::read_dir(store.join("logs")).ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let t = std::fs::read_to_string(e.path()).ok()?;
                t.contains("sleeping").then(|| {
                    t.lines()
                        .find(|l| l.starts_with("rredcot: Slurm job "))
                        .map(|l| l.split_whitespace().nth(3).unwrap().to_string())
                })?
            })
        });
        if let Some(j) = found {
            break j;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the job did not start within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let sq = Command::new("squeue")
        .args(["-h", "-t", "all", "-j", &job, "-o", "%T"])
        .output()
        .unwrap();
    let state = String::from_utf8_lossy(&sq.stdout).trim().to_string();
    assert!(
        state.is_empty() || state == "CANCELLED",
        "job {job} is {state} after Ctrl-C"
    );
    // The run reports an interruption (not a failure) after cancelling the job.
    assert!(
        text(&out).contains("scancel: cancelled Slurm jobs")
            && text(&out).contains("stopped  slow"),
        "{}",
        text(&out)
    );
}

#[test]
fn slurm_unknown_partition_and_failing_sbatch_are_clear_errors() {
    let Some(_) = cluster("slurm_unknown_partition_and_failing_sbatch_are_clear_errors") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let run = |profile: &Path| {
        rredcot(
            &[
                "--store",
                store.to_str().unwrap(),
                "pipeline",
                "run",
                "pipelines/engine-demo.toml",
                "--executor",
                "slurm",
                "--profile",
                profile.to_str().unwrap(),
            ],
            &[],
        )
    };
    let o = run(&fast_profile(
        dir.path(),
        "partition = \"no-such-partition\"\n",
    ));
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("unknown Slurm partition `no-such-partition`") && t.contains("the cluster has:"),
        "{t}"
    );
    // The profile can also come from the environment.
    let o = rredcot(
        &[
            "--store",
            store.to_str().unwrap(),
            "pipeline",
            "run",
            "pipelines/engine-demo.toml",
            "--executor",
            "slurm",
        ],
        &[(
            "RREDCOT_SLURM_PROFILE",
            dir.path().join("profile.toml").to_str().unwrap(),
        )],
    );
    assert!(
        text(&o).contains("unknown Slurm partition `no-such-partition`"),
        "{}",
        text(&o)
    );

    let o = run(&fast_profile(
        dir.path(),
        "extra_args = [\"--no-such-sbatch-flag\"]\n",
    ));
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(
        t.contains("sbatch rejected the job for numbers") && t.contains("no-such-sbatch-flag"),
        "{t}"
    );
    assert!(
        std::fs::read_dir(store.join("instances"))
            .unwrap()
            .next()
            .is_none(),
        "nothing is committed"
    );
    // A stage that fails inside its job: Slurm's state and reason, and the stage's stderr.
    write(
        &dir.path().join("stages/bad.toml"),
        "command = \"echo boom-on-stderr >&2; exit 3\"\n[outputs]\nout = \"dir\"\n",
    );
    let pipeline = dir.path().join("pipelines/bad.toml");
    write(&pipeline, "[[stage]]\nname = \"bad\"\n");
    let o = rredcot(
        &[
            "--store",
            store.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline.to_str().unwrap(),
            "--executor",
            "slurm",
            "--profile",
            fast_profile(dir.path(), "").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(
        t.contains("ended FAILED") && t.contains("NonZeroExitCode") && t.contains("boom-on-stderr"),
        "{t}"
    );
}

#[test]
fn slurm_without_sbatch_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("bin");
    std::fs::create_dir_all(&empty).unwrap();
    let store = dir.path().join("store");
    let o = rredcot(
        &[
            "--store",
            store.to_str().unwrap(),
            "pipeline",
            "run",
            "pipelines/engine-demo.toml",
            "--executor",
            "slurm",
        ],
        &[("PATH", empty.to_str().unwrap())],
    );
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("`sbatch` is not on PATH"), "{t}");
    assert!(std::fs::read_dir(store.join("instances"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn slurm_memory_limit_is_reported() {
    let Some(c) = cluster("slurm_memory_limit_is_reported") else {
        return;
    };
    if !c.ours {
        eprintln!("SKIP slurm_memory_limit_is_reported: needs the local test cluster's memory enforcement");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // `tail` buffers all of a newline-free stream: about 600 MB against a 50 MB limit, held for 5 s
    // so a sampling enforcer (jobacct_gather every second) sees it before the job could end.
    // Depending on the enforcement Slurm kills the whole job or only `tail`; `&&` fails either way.
    write(
        &dir.path().join("stages/hog.toml"),
        "command = \"(head -c 600M /dev/zero; sleep 5) | tail > /dev/null && echo done > {outputs.out}/x\"\n\
         [outputs]\nout = \"dir\"\n[resources]\nmem = \"50MB\"\n",
    );
    let pipeline = dir.path().join("pipelines/hog.toml");
    write(&pipeline, "[[stage]]\nname = \"hog\"\n");
    let o = rredcot(
        &[
            "--store",
            store.to_str().unwrap(),
            "pipeline",
            "run",
            pipeline.to_str().unwrap(),
            "--executor",
            "slurm",
            "--profile",
            fast_profile(dir.path(), "").to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        // "killed for …" when Slurm names it, "killed by SIGKILL, likely for …" when it only
        // reports signal 9 (a kill early in the step reads JobLaunchFailure).
        t.contains("for exceeding its memory limit") && t.contains("raise resources.mem"),
        "{t}"
    );
    let key = keys_of(&o)["hog"].clone();
    assert!(!store.join("instances").join(&key).join("run.json").exists());
}
