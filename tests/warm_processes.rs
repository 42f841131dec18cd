//! Warm stage processes (engine/src/warm.rs) through the real binary: builtins run one after
//! another in one process with the outputs fresh processes give, a failure retires the process,
//! and a process killed mid-instance fails that instance only.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{names, text, Project, DEMO};
use rredcot::engine::warm::SERVED_BY;

/// (pid, instance number in that process) from an instance's log, if a warm process ran it.
fn served_by(log: &str) -> Option<(u32, u32)> {
    let rest = log.lines().find_map(|l| l.strip_prefix(SERVED_BY))?;
    let (pid, rest) = rest.trim().split_once(", instance ")?;
    Some((pid.parse().ok()?, rest.split_whitespace().next()?.parse().ok()?))
}

fn log_of(p: &Project, key: &str) -> String {
    std::fs::read_to_string(p.store().join("logs").join(format!("{key}.log"))).unwrap_or_default()
}

/// Instance name -> (pid, number) for every instance of a run summary.
fn processes(p: &Project, summary: &serde_json::Value) -> BTreeMap<String, Option<(u32, u32)>> {
    summary["keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, key)| (name.clone(), served_by(&log_of(p, key.as_str().unwrap()))))
        .collect()
}

fn output_hashes(p: &Project, summary: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, serde_json::Value>> {
    summary["keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, key)| {
            let rec = p.record(key.as_str().unwrap());
            let outs = rec["outputs"].as_object().unwrap().iter().map(|(o, r)| (o.clone(), r["hash"].clone())).collect();
            (name.clone(), outs)
        })
        .collect()
}

#[test]
fn builtins_run_in_turn_in_one_process_and_give_what_fresh_processes_give() {
    let warm = Project::new();
    let pl = warm.pipeline("demo", DEMO);
    let s = warm.run_ok(&pl, &["-j", "1"]);
    let by = processes(&warm, &s);
    assert_eq!(by.len(), 10, "{by:?}");
    let pids: std::collections::BTreeSet<u32> = by.values().map(|v| v.expect("every builtin ran in a warm process").0).collect();
    assert_eq!(pids.len(), 1, "one process ran every instance: {by:?}");
    let mut numbers: Vec<u32> = by.values().map(|v| v.unwrap().1).collect();
    numbers.sort();
    assert_eq!(numbers, (1..=10).collect::<Vec<_>>(), "{by:?}");
    for key in s["keys"].as_object().unwrap().values() {
        let rec = warm.record(key.as_str().unwrap());
        assert!(rec["peak_rss_mb"].as_f64().unwrap() > 0.0, "{rec}");
    }

    let fresh = Project::new();
    let pl = fresh.pipeline("demo", DEMO);
    let f = fresh.run_ok(&pl, &["-j", "1", "--fresh-processes"]);
    assert!(processes(&fresh, &f).values().all(Option::is_none), "--fresh-processes: a process per instance");
    assert_eq!(s["keys"], f["keys"], "same instances");
    assert_eq!(output_hashes(&warm, &s), output_hashes(&fresh, &f), "same artifacts");
    // Nothing is left running: the runner's warm processes end with it.
    let proc_dir = format!("/proc/{}", pids.first().unwrap());
    let t0 = Instant::now();
    while Path::new(&proc_dir).exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!Path::new(&proc_dir).exists(), "a warm process outlived its run");
}

#[test]
fn rredcot_warm_max_instances_bounds_what_one_process_runs() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let out = p.cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "1", "--json"]).env("RREDCOT_WARM_MAX_INSTANCES", "3").output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let by = processes(&p, &s);
    let mut per_process: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for v in by.values() {
        let (pid, n) = v.expect("a warm process ran it");
        per_process.entry(pid).or_default().push(n);
    }
    // 10 instances, 3 per process: 4 processes, each numbered from 1, none lost on the way.
    assert_eq!(per_process.len(), 4, "{by:?}");
    for ns in per_process.values_mut() {
        ns.sort();
        assert_eq!(ns[0], 1, "{by:?}");
        assert!(ns.len() <= 3 && ns.windows(2).all(|w| w[1] == w[0] + 1), "{by:?}");
    }

    let q = Project::new();
    let pl = q.pipeline("demo", DEMO);
    let out = q.cmd(&["pipeline", "run", pl.to_str().unwrap()]).env("RREDCOT_WARM_MAX_INSTANCES", "none").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("RREDCOT_WARM_MAX_INSTANCES = `none`: expected a whole number"), "{err}");
    // Refused by the runner before any instance started (not by each warm process in turn).
    assert!(!err.contains("numbers"), "{err}");
    assert!(q.committed().is_empty());
}

#[test]
fn a_failed_instance_retires_its_process_and_the_next_gets_a_fresh_one() {
    let p = Project::new();
    // `over` writes infinities (x * 1e308 * 10), which `fail` refuses to read; the chain a2..a6
    // still has instances to run after `fail` has failed.
    let pl = p.pipeline(
        "fails",
        r#"
[[stage]]
name = "numbers"
uses = "demo_numbers"
params = { n = 20, seed = 7 }
[[stage]]
name = "over"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 1e308, digits = 1 }
[[stage]]
name = "a2"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 2.0 }
[[stage]]
name = "fail"
uses = "demo_scale"
inputs = { table = "over.table" }
[[stage]]
name = "a3"
uses = "demo_scale"
inputs = { table = "a2.table" }
[[stage]]
name = "a4"
uses = "demo_scale"
inputs = { table = "a3.table" }
[[stage]]
name = "a5"
uses = "demo_scale"
inputs = { table = "a4.table" }
[[stage]]
name = "a6"
uses = "demo_scale"
inputs = { table = "a5.table" }
"#,
    );
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "-j", "1", "--keep-going", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&s, "failed"), ["fail"]);
    assert_eq!(names(&s, "ran"), ["a2", "a3", "a4", "a5", "a6", "numbers", "over"]);
    let by = processes(&p, &s);
    let (failed_pid, failed_n) = by["fail"].expect("fail ran in a warm process");
    assert!(log_of(&p, s["keys"]["fail"].as_str().unwrap()).contains("column `x` is inf"), "its error is in its log");
    for (name, (pid, n)) in by.iter().map(|(k, v)| (k, v.unwrap())) {
        if pid == failed_pid && name != "fail" {
            assert!(n < failed_n, "{name} ran in the process after its failure: {by:?}");
        }
    }
    assert!(by["a6"].unwrap().0 != failed_pid, "the last instance ran after the failure, in a fresh process: {by:?}");
}

#[test]
fn a_process_killed_mid_instance_fails_that_instance_only() {
    let p = Project::new();
    let pl = p.pipeline(
        "killed",
        r#"
[[stage]]
name = "numbers"
uses = "demo_numbers"
params = { n = 20, seed = 7 }
[[stage]]
name = "slow"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 2.0, sleep_ms = 60000 }
[[stage]]
name = "then"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 3.0 }
[[stage]]
name = "then2"
uses = "demo_scale"
inputs = { table = "then.table" }
[[stage]]
name = "then3"
uses = "demo_scale"
inputs = { table = "then2.table" }
"#,
    );
    let child = p
        .cmd(&["pipeline", "run", pl.to_str().unwrap(), "-j", "1", "--keep-going", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `slow` is the instance that has started and stays uncommitted; kill its process while it
    // sleeps.
    let running = || -> Option<(u32, u32)> {
        std::fs::read_dir(p.store().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .filter(|log| !log.contains("committed"))
            .find_map(|log| served_by(&log))
    };
    let t0 = Instant::now();
    let (pid, slow_n) = loop {
        if let Some(first) = running() {
            std::thread::sleep(Duration::from_millis(300));
            if running() == Some(first) {
                break first;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "`slow` never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: signalling the stage process the run started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&s, "failed"), ["slow"]);
    assert_eq!(names(&s, "ran"), ["numbers", "then", "then2", "then3"]);
    // Whichever of `slow` and `then` went first, `then3` ran after the kill: in a fresh process.
    for name in ["numbers", "then", "then2", "then3"] {
        let (by, n) = served_by(&log_of(&p, s["keys"][name].as_str().unwrap())).unwrap();
        assert!(by != pid || n < slow_n, "{name} ran in the killed process after `slow`");
        if name == "then3" {
            assert_ne!(by, pid, "then3 ran after the kill, in a fresh process");
        }
    }
    assert!(!p.committed().contains(&s["keys"]["slow"].as_str().unwrap().to_string()));
    // As after a killed `stage exec`: the half-written output is never read, and the next run
    // removes it.
    p.run_ok(&pl, &["--until", "numbers"]);
    assert_eq!(std::fs::read_dir(p.store().join("tmp")).unwrap().count(), 0, "the killed instance's temp output is cleaned");
}

#[test]
fn an_instance_goes_to_the_idle_process_that_last_ran_its_stage_kind() {
    let p = Project::new();
    // `scaled` and `summed` run side by side, in two processes; `summed` ends first, so its
    // process is the first idle one when `rescaled` (the kind `scaled` ran) is handed out.
    let pl = p.pipeline(
        "affinity",
        r#"
[[stage]]
name = "numbers"
uses = "demo_numbers"
params = { n = 20, seed = 7 }
[[stage]]
name = "scaled"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 2.0, sleep_ms = 1500 }
[[stage]]
name = "summed"
uses = "demo_sum"
inputs = { table = "numbers.table" }
[[stage]]
name = "rescaled"
uses = "demo_scale"
inputs = { table = "scaled.table" }
params = { factor = 3.0 }
"#,
    );
    let s = p.run_ok(&pl, &["-j", "2"]);
    let by = processes(&p, &s);
    let pid = |name: &str| by[name].unwrap_or_else(|| panic!("{name} ran in a warm process: {by:?}")).0;
    assert_ne!(pid("scaled"), pid("summed"), "side by side in two processes: {by:?}");
    assert_eq!(pid("rescaled"), pid("scaled"), "the process that last ran demo_scale: {by:?}");
}
