//! Cache behaviour through the real binary: hit/miss matrix, early cutoff, chains, --until,
//! --force, determinism across stores.

mod common;

use common::{names, Project, DEMO};

/// A pipeline mixing builtins, a `file:` input and two external shell stages with scripts.
fn mixed(p: &Project) -> std::path::PathBuf {
    p.write("data/words.txt", "alpha\nbeta\ngamma\n");
    p.write("scripts/count.sh", "#!/bin/sh\nwc -l < \"$1\" | tr -d ' ' > \"$2/count.txt\"\n");
    p.write("scripts/plus.sh", "#!/bin/sh\nn=$(cat \"$1/count.txt\")\necho $((n + $3)) > \"$2/total.txt\"\n");
    p.write(
        "stages/count_lines.toml",
        "command = [\"sh\", \"{script}\", \"{inputs.src}\", \"{outputs.out}\"]\nscript = \"../scripts/count.sh\"\nversion = \"1\"\n[inputs]\nsrc = \"dir\"\n[outputs]\nout = \"dir\"\n",
    );
    p.write(
        "stages/plus.toml",
        "command = [\"sh\", \"{script}\", \"{inputs.src}\", \"{outputs.out}\", \"{params.add}\"]\nscript = \"../scripts/plus.sh\"\nversion = \"1\"\n[inputs]\nsrc = \"dir\"\n[outputs]\nout = \"dir\"\n[params]\nadd = 1\n",
    );
    let body = format!(
        "{DEMO}\n[[stage]]\nname = \"count\"\nuses = \"count_lines\"\ninputs = {{ src = \"file:data/words.txt\" }}\n\n[[stage]]\nname = \"plus\"\ninputs = {{ src = \"count.out\" }}\nparams = {{ add = 10 }}\n"
    );
    p.pipeline("mixed", &body)
}

#[test]
fn hit_miss_matrix_reruns_exactly_the_affected_instances() {
    let p = Project::new();
    let pl = mixed(&p);
    let s = p.run_ok(&pl, &[]);
    assert_eq!(names(&s, "ran").len(), 12, "first run runs everything: {s}");
    let total = std::fs::read_to_string(p.store().join("instances").join(s["keys"]["plus"].as_str().unwrap()).join("outputs/out/total.txt")).unwrap();
    assert_eq!(total.trim(), "13");

    // Nothing changed: everything cached.
    let s = p.run_ok(&pl, &[]);
    assert!(names(&s, "ran").is_empty(), "{s}");
    assert_eq!(names(&s, "cached").len(), 12);

    // A param: triple and its sum rerun, nothing else.
    let s = p.run_ok(&pl, &["--set", "triple.factor=4"]);
    assert_eq!(names(&s, "ran"), vec!["sum_triple", "triple"]);

    // An input file: count and plus rerun.
    p.write("data/words.txt", "alpha\nbeta\ngamma\ndelta\n");
    let s = p.run_ok(&pl, &["--set", "triple.factor=4"]);
    assert_eq!(names(&s, "ran"), vec!["count", "plus"]);

    // A stage's code version: the kind's instances and everything downstream whose input changed.
    let kind = p.path().join("stages/plus.toml");
    let text = std::fs::read_to_string(&kind).unwrap().replace("version = \"1\"", "version = \"2\"");
    std::fs::write(&kind, text).unwrap();
    let s = p.run_ok(&pl, &["--set", "triple.factor=4"]);
    assert_eq!(names(&s, "ran"), vec!["plus"]);

    // An external script's bytes.
    p.write("scripts/count.sh", "#!/bin/sh\n# counts lines\nwc -l < \"$1\" | tr -d ' ' > \"$2/count.txt\"\n");
    let s = p.run_ok(&pl, &["--set", "triple.factor=4"]);
    // count reruns; its output is byte-identical, so plus stays cached (early cutoff).
    assert_eq!(names(&s, "ran"), vec!["count"]);
    // explain names what an external stage's code is: the file's version and the script's bytes.
    use sha2::Digest;
    let script_sha = hex::encode(sha2::Sha256::digest(std::fs::read(p.path().join("scripts/count.sh")).unwrap()));
    let out = p.run(&["pipeline", "explain", pl.to_str().unwrap(), "count"]);
    let ex = String::from_utf8_lossy(&out.stdout);
    assert!(ex.contains(&format!("code       version 1 (the stage file's), the command, script sha256 {}", &script_sha[..12])), "{ex}");

    // The chain's params: all four steps and final.
    let s = p.run_ok(&pl, &["--set", "triple.factor=4", "--set", "train.step.decay=0.25"]);
    assert_eq!(names(&s, "ran"), vec!["final", "train.step[0]", "train.step[1]", "train.step[2]", "train.step[3]"]);
}

#[test]
fn early_cutoff_identical_output_keeps_downstream_cached() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    p.run_ok(&pl, &[]);
    // `threads` changes the key of `double` but not its bytes.
    let s = p.run_ok(&pl, &["--set", "double.threads=4"]);
    assert_eq!(names(&s, "ran"), vec!["double"]);
    assert_eq!(names(&s, "cached").len(), 9);
    // Rounding to 0 digits changes the output of `double` -> downstream reruns.
    let s = p.run_ok(&pl, &["--set", "double.digits=0"]);
    assert_eq!(names(&s, "ran"), vec!["double", "final", "sum_double", "train.step[0]", "train.step[1]", "train.step[2]", "train.step[3]"]);
}

#[test]
fn longer_chain_resumes_from_finished_steps() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    p.run_ok(&pl, &[]);
    let s = p.run_ok(&pl, &["--set", "train.repeat=6"]);
    assert_eq!(names(&s, "ran"), vec!["final", "train.step[4]", "train.step[5]"]);
    let step_counts: i64 = s["counters"]["steps"].as_i64().unwrap();
    assert_eq!(step_counts, 2, "only two new steps ran");
}

#[test]
fn until_and_force() {
    let p = Project::new();
    let pl = p.pipeline("demo", DEMO);
    let s = p.run_ok(&pl, &["--until", "sum_triple"]);
    assert_eq!(names(&s, "ran"), vec!["numbers", "sum_triple", "triple"]);
    let s = p.run_ok(&pl, &["--force", "numbers", "--until", "triple"]);
    assert_eq!(names(&s, "ran"), vec!["numbers"], "forced rerun reproduces identical bytes: downstream cached");
    // The superseded instance is kept in quarantine, not deleted.
    assert_eq!(std::fs::read_dir(p.store().join("quarantine")).unwrap().count(), 1);
}

#[test]
fn two_fresh_stores_give_identical_hashes() {
    let a = Project::new();
    let b = Project::new();
    let sa = a.run_ok(&a.pipeline("demo", DEMO), &[]);
    let sb = b.run_ok(&b.pipeline("demo", DEMO), &[]);
    assert_eq!(sa["keys"], sb["keys"]);
    for key in a.committed() {
        let (ra, rb) = (a.record(&key), b.record(&key));
        for (name, o) in ra["outputs"].as_object().unwrap() {
            assert_eq!(o["hash"], rb["outputs"][name]["hash"], "{key} output {name}");
        }
    }
    assert_eq!(a.committed(), b.committed());
}

#[test]
fn run_record_has_the_contract_fields() {
    let p = Project::new();
    let s = p.run_ok(&p.pipeline("demo", DEMO), &[]);
    let key = s["keys"]["numbers"].as_str().unwrap();
    let r = p.record(key);
    for f in ["key", "stage", "kind", "wall_s", "peak_rss_mb", "inputs", "params", "counters", "start", "end", "host", "versions"] {
        assert!(!r[f].is_null(), "run.json lacks `{f}`: {r}");
    }
    assert_eq!(r["key"], key);
    assert_eq!(r["stage"], "numbers");
    assert_eq!(r["counters"]["rows"], 200);
    assert!(r["peak_rss_mb"].as_f64().unwrap() > 0.0);
    assert!(r["versions"]["arrow"].is_string());
}

#[test]
fn input_groups_take_labelled_members_and_one_per_chain_step() {
    let p = Project::new();
    // Writes the io JSON it got: the test reads which inputs arrived under which names.
    p.write(
        "stages/collect.toml",
        "command = \"mkdir -p {outputs.out} && cp {io} {outputs.out}/io.json\"\nversion = \"1\"\n[input_groups]\nxs = \"table\"\n[outputs]\nout = \"dir\"\n",
    );
    let body = r#"
[[stage]]
name = "numbers"
uses = "demo_numbers"
params = { n = 5, seed = 1 }

[[chain]]
name = "train"
repeat = 3
carry = { "step.state" = "step.state" }
  [[chain.stage]]
  name = "step"
  uses = "demo_step"
  inputs = { state = "numbers.table" }

[[stage]]
name = "collect"
inputs = { "xs.first" = "numbers.table", "xs.curve" = "train.step[*].state", "xs.final" = "train.step[last].state" }
"#;
    let pl = p.pipeline("groups", body);
    let s = p.run_ok(&pl, &[]);
    let key = s["keys"]["collect"].as_str().unwrap();
    let io: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.store().join("instances").join(key).join("outputs/out/io.json")).unwrap()).unwrap();
    let names: Vec<&String> = io["inputs"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["xs.curve[0]", "xs.curve[1]", "xs.curve[2]", "xs.final", "xs.first"], "{io}");
    let path = |n: &str| io["inputs"][n]["path"].as_str().unwrap().to_string();
    assert_eq!(std::fs::read(path("xs.curve[2]")).unwrap(), std::fs::read(path("xs.final")).unwrap());
    assert_ne!(std::fs::read(path("xs.curve[0]")).unwrap(), std::fs::read(path("xs.curve[1]")).unwrap());

    // A longer chain adds a member, so the collector reruns; the steps already done stay cached.
    let s = p.run_ok(&pl, &["--set", "train.repeat=4"]);
    assert_eq!(names_of(&s, "ran"), ["collect", "train.step[3]"], "{s}");

    // Unknown group or a member outside any group: a clear wiring error.
    let bad = p.pipeline("bad", "[[stage]]\nname = \"numbers\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"collect\"\ninputs = { \"ys.a\" = \"numbers.table\" }\n");
    let out = p.run(&["pipeline", "run", bad.to_str().unwrap()]);
    let err = common::text(&out.stderr);
    assert!(!out.status.success() && err.contains("no input `ys.a`") && err.contains("xs.<label> (group)"), "{err}");
    let bad = p.pipeline("bad2", "[[stage]]\nname = \"numbers\"\nuses = \"demo_numbers\"\n[[stage]]\nname = \"collect\"\ninputs = { \"xs.a\" = \"numbers[*].table\" }\n");
    let err = common::text(&p.run(&["pipeline", "run", bad.to_str().unwrap()]).stderr);
    assert!(err.contains("no chain `numbers`"), "{err}");
}

fn names_of(s: &serde_json::Value, field: &str) -> Vec<String> {
    let mut v = names(s, field);
    v.sort();
    v
}

#[test]
fn set_rewires_an_input_to_another_output_or_a_file() {
    let p = Project::new();
    let pl = mixed(&p);
    let s = p.run_ok(&pl, &[]);
    let total = |s: &serde_json::Value| {
        std::fs::read_to_string(p.store().join("instances").join(s["keys"]["plus"].as_str().unwrap()).join("outputs/out/total.txt")).unwrap()
    };
    assert_eq!(total(&s).trim(), "13");
    // A file relative to where the command runs (the project dir here), not to the pipeline.
    p.write("more.txt", "a\nb\nc\nd\ne\n");
    let s = p.run_ok(&pl, &["--set", "count.inputs.src=file:more.txt"]);
    assert_eq!(names_of(&s, "ran"), ["count", "plus"], "{s}");
    assert_eq!(total(&s).trim(), "15");
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--set", "count.inputs.nope=file:more.txt"]);
    let err = common::text(&out.stderr);
    assert!(!out.status.success() && err.contains("has no input `nope`"), "{err}");
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--set", "count.inputs.src=file:missing.txt"]);
    assert!(common::text(&out.stderr).contains("does not exist"));
}

#[test]
fn set_uses_swaps_a_stage_kind_and_drops_params_it_lacks_with_a_warning() {
    let p = Project::new();
    let pl = p.pipeline("swap", DEMO);
    let s = p.run_ok(&pl, &[]);
    let value = |s: &serde_json::Value, stage: &str| {
        let key = s["keys"][stage].as_str().unwrap();
        let path = p.store().join("instances").join(key).join("outputs/table.parquet");
        std::fs::read(path).unwrap()
    };
    let scaled = value(&s, "double");
    // `double` (demo_scale, factor 2) becomes demo_sum (same input and output): `factor` is dropped.
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--json", "--set", "double.uses=demo_sum"]);
    let err = common::text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("param `factor`") && err.contains("`demo_sum`") && err.contains("dropped"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(names_of(&s, "ran").contains(&"double".to_string()), "{s}");
    assert_ne!(value(&s, "double"), scaled);
    // A kind without the stage's inputs is a wiring error; an unknown stage a --set error.
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--set", "double.uses=demo_numbers"]);
    assert!(common::text(&out.stderr).contains("has no input `table`"), "{}", common::text(&out.stderr));
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap(), "--set", "nope.uses=demo_sum"]);
    assert!(common::text(&out.stderr).contains("no stage `nope`"));
}

/// A stage file that `extends` another states only what differs: its instances get exactly the
/// keys of the same stage kinds written out in full; an unknown parent and a cycle are clear errors.
#[test]
fn a_stage_file_extending_another_keys_like_the_full_file() {
    let repo_stage = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/demo_scale.toml")).unwrap();
    let full = repo_stage.replace("factor = 2.0", "factor = 5.0").replace("x * factor", "x * 5");
    // Project a: the kinds written out in full; project b: by extension (the parent found in the
    // repo's stage dir), and a grandchild.
    let (a, b) = (Project::new(), Project::new());
    a.write("stages/five.toml", &full);
    a.write("stages/five_again.toml", &full);
    b.write("stages/five.toml", "extends = \"demo_scale\"\ndescription = \"x * 5\"\n[params]\nfactor = 5.0\n");
    b.write("stages/five_again.toml", "extends = \"five\"\n");
    let body = "[[stage]]\nname = \"numbers\"\nuses = \"demo_numbers\"\nparams = { n = 50, seed = 1 }\n\
        [[stage]]\nname = \"ext\"\nuses = \"five\"\ninputs = { table = \"numbers.table\" }\n\
        [[stage]]\nname = \"ext2\"\nuses = \"five_again\"\ninputs = { table = \"numbers.table\" }\n\
        [[stage]]\nname = \"plain\"\nuses = \"demo_scale\"\ninputs = { table = \"numbers.table\" }\n";
    let sa = a.run_ok(&a.pipeline("ext", body), &[]);
    let sb = b.run_ok(&b.pipeline("ext", body), &[]);
    for n in ["ext", "ext2", "plain"] {
        assert_eq!(sa["keys"][n], sb["keys"][n], "{n}");
    }
    assert_ne!(sb["keys"]["ext"], sb["keys"]["plain"], "the overridden param enters the key");
    // Unknown parent; a cycle.
    b.write("stages/orphan.toml", "extends = \"no_such_kind\"\n");
    b.write("stages/loop_a.toml", "extends = \"loop_b\"\n");
    b.write("stages/loop_b.toml", "extends = \"loop_a\"\n");
    for (kind, want) in [("orphan", "no_such_kind"), ("loop_a", "`extends` makes a cycle: loop_a -> loop_b -> loop_a")] {
        let pl = b.pipeline(kind, &format!("[[stage]]\nname = \"x\"\nuses = \"{kind}\"\n"));
        let out = b.run(&["pipeline", "run", pl.to_str().unwrap()]);
        let err = common::text(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{kind}: {err}");
    }
}

/// A large `file:` input (a checkpoint) is read in full once: its hash is remembered in the
/// store by the file's identity and used by later runs and by `stage exec`'s input check. A
/// rewrite that keeps its size and mtime is still seen; `RREDCOT_REHASH=1` reads it again.
#[test]
fn a_large_file_input_is_hashed_once_and_a_rewrite_is_still_seen() {
    let p = Project::new();
    let big = p.path().join("ckpt/model.bin");
    std::fs::create_dir_all(big.parent().unwrap()).unwrap();
    let bytes: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&big, &bytes).unwrap();
    // Only a file left alone for 2 s before it is hashed has its hash remembered.
    std::thread::sleep(std::time::Duration::from_millis(2200));
    p.write(
        "stages/checksum.toml",
        "command = \"cksum < '{inputs.src}/model.bin' > '{outputs.out}/sum.txt'\"\n[inputs]\nsrc = \"dir\"\n[outputs]\nout = \"dir\"\n",
    );
    let pl = p.pipeline("ckpt", "[[stage]]\nname = \"sum\"\nuses = \"checksum\"\ninputs = { src = \"file:ckpt\" }\n");
    let sum_of = |s: &serde_json::Value| {
        let key = s["keys"]["sum"].as_str().unwrap().to_string();
        let sum = std::fs::read_to_string(p.store().join("instances").join(&key).join("outputs/out/sum.txt")).unwrap();
        (key, sum)
    };
    let s = p.run_ok(&pl, &[]);
    assert_eq!(names(&s, "ran"), vec!["sum"]);
    let (key, sum) = sum_of(&s);

    // One entry, the checkpoint's (the stage's output is small: always re-hashed).
    let entries: Vec<std::path::PathBuf> =
        std::fs::read_dir(p.store().join("hashes")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut entry: serde_json::Value = serde_json::from_slice(&std::fs::read(&entries[0]).unwrap()).unwrap();
    assert_eq!(entry["id"]["size"], 5_000_000);
    assert_eq!(entry["path"].as_str(), big.to_str(), "the entry names its file, for gc");

    // A planted hash for the same identity keys the input: the run did not read the file.
    entry["sha256"] = serde_json::Value::String("0".repeat(64));
    std::fs::write(&entries[0], entry.to_string()).unwrap();
    let s = p.run_ok(&pl, &[]);
    assert_eq!(names(&s, "ran"), vec!["sum"], "{s}");
    assert_ne!(sum_of(&s).0, key);

    // RREDCOT_REHASH=1 reads it again: the true hash, the first key, cached.
    let out = p.cmd(&["pipeline", "run", pl.to_str().unwrap(), "--json"]).env("RREDCOT_REHASH", "1").output().unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&s, "cached"), vec!["sum"], "{s}");
    assert_eq!(sum_of(&s).0, key);

    // One byte rewritten, size and mtime kept: a new key and a new checksum.
    let mtime = std::fs::metadata(&big).unwrap().modified().unwrap();
    let mut changed = bytes.clone();
    changed[2_500_000] ^= 1;
    std::fs::write(&big, &changed).unwrap();
    std::fs::File::options().write(true).open(&big).unwrap().set_modified(mtime).unwrap();
    let s = p.run_ok(&pl, &[]);
    assert_eq!(names(&s, "ran"), vec!["sum"], "{s}");
    let (new_key, new_sum) = sum_of(&s);
    assert_ne!(new_key, key);
    assert_ne!(new_sum, sum);

    // Once the checkpoint is gone, `artifact gc` drops its remembered hash (a dry run only says so).
    std::fs::remove_file(&big).unwrap();
    for (dry, left) in [(true, 1), (false, 0)] {
        let mut args = vec!["artifact", "gc", pl.to_str().unwrap()];
        if dry {
            args.push("--dry-run");
        }
        let out = p.run(&args);
        assert!(out.status.success(), "{}", common::text(&out.stderr));
        let said = common::text(&out.stdout);
        let want = if dry { "kept 0, would remove 1" } else { "kept 0, removed 1" };
        assert!(said.contains(&format!("remembered hashes of large files: {want}")), "{said}");
        assert_eq!(std::fs::read_dir(p.store().join("hashes")).unwrap().count(), left);
    }
}
