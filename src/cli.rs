//! Command-line interface (shared by `rredcot` and `rredcot-worker`; they differ only in the
//! builtins they can run in-process).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::artifact::Schema;
use crate::engine::exec::{exec_instance, ExecOutcome};
use crate::engine::group as signals;
use crate::engine::local::LocalExecutor;
use crate::engine::plan::{name_list, no_stage, InputRef, ParamSource};
use crate::engine::cache::why_not_cached;
use crate::engine::file_hashes::FileHashes;
use crate::engine::resolve::Resolver;
use crate::engine::runner::{detect_gpus, referenced_keys, run_pipeline, RunOptions};
use crate::engine::Programs;
use crate::engine::slurm::{SlurmExecutor, SlurmProfile};
use crate::engine::spec::short;
use crate::engine::{load_plan, EngineError, Plan, Runtime, SetArg, Store};

#[derive(Parser)]
#[command(
    name = "rredcot",
    version,
    about = "Content-addressed pipelines for RL credit assignment on reasoning LMs"
)]
struct Cli {
    /// Artifact store directory [env: RREDCOT_STORE] [default: .rredcot/store]
    #[arg(long, global = true)]
    store: Option<PathBuf>,
    /// More output (cached instances, reasons).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run, inspect and explain pipelines.
    #[command(subcommand)]
    Pipeline(PipelineCmd),
    /// Run single stage instances (what cluster jobs run).
    #[command(subcommand)]
    Stage(StageCmd),
    /// Inspect, verify and collect artifacts in the store.
    #[command(subcommand)]
    Artifact(ArtifactCmd),
    /// Copy a finished pipeline's report (its `report` stage output) to a directory and print
    /// its results table.
    Report {
        #[command(flatten)]
        plan: PlanArgs,
        /// The report stage of the pipeline.
        #[arg(long, default_value = "report")]
        stage: String,
        /// Where to copy the report [default: reports/<pipeline name>].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve a checkpoint over an OpenAI-compatible API (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/models`): a checkpoint directory or GGUF file, or with `--pipeline` a stage's
    /// checkpoint in the store.
    Serve(ServeArgs),
}

/// `rredcot serve`: run by `rredcot-worker` (the model core links libtorch); `rredcot` hands over.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Checkpoint directory (Hugging Face layout with tokenizer.json) or a GGUF file; with
    /// `--pipeline`, a stage's checkpoint output: `STAGE` or `STAGE.OUTPUT` (`sft`,
    /// `rredcot.update[9]`, `rredcot.update[9].policy`).
    #[arg(long)]
    pub model: PathBuf,
    /// With `--pipeline`: the `--set` its run was given (the stage is looked up in that variant).
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE", requires = "pipeline")]
    pub sets: Vec<String>,
    /// A pipeline file: `--model` names one of its stages, served from the store once that stage
    /// is up to date (the model id defaults to `STAGE.OUTPUT`).
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// Address to listen on; loopback by default (there is no authentication).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port; 0 picks a free one (the listening address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model id reported by `/v1/models` and in responses [default: the checkpoint's name].
    #[arg(long)]
    pub model_name: Option<String>,
    /// auto | cpu | cuda
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// auto | f32 | bf16
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// Default and upper bound of a request's `max_tokens`.
    #[arg(long, default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_new_tokens: usize,
    /// Most sequences decoded at once: concurrent requests share these slots, each row sampled
    /// with its own params, a finished sequence's slot taking the next waiting one (continuous
    /// batching).
    #[arg(long, default_value_t = 16, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_batch: usize,
    /// libtorch CPU threads (0 = its default).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl ServeArgs {
    /// The command line that gives these args to `serve` (the worker's, after a hand-over).
    fn command_line(&self) -> Vec<std::ffi::OsString> {
        // `--pipeline` is resolved into `--model` before a hand-over, so it is not passed on.
        let mut a: Vec<std::ffi::OsString> = vec!["serve".into(), "--model".into(), self.model.clone().into_os_string()];
        if let Some(n) = &self.model_name {
            a.extend(["--model-name".into(), n.into()]);
        }
        for (flag, v) in [
            ("--host", self.host.clone()),
            ("--port", self.port.to_string()),
            ("--device", self.device.clone()),
            ("--dtype", self.dtype.clone()),
            ("--max-new-tokens", self.max_new_tokens.to_string()),
            ("--max-batch", self.max_batch.to_string()),
            ("--threads", self.threads.to_string()),
        ] {
            a.extend([flag.into(), v.into()]);
        }
        a
    }
}

/// What runs `serve` in this binary (`None` in `rredcot`, which hands over to `rredcot-worker`).
pub type ServeFn = fn(&ServeArgs) -> Result<()>;

#[derive(clap::Args, Clone)]
struct PlanArgs {
    /// Pipeline file (TOML).
    pipeline: PathBuf,
    /// Override a param: `stage.param=value` or `stage.params.param=value` (stage, chain.stage or
    /// chain.stage[i]; `*` = every stage that has it); `chain.repeat=N`; `stage.inputs.NAME=REF`;
    /// `stage.uses=KIND`.
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
    sets: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExecutorKind {
    Local,
    Slurm,
}

#[derive(Subcommand)]
enum PipelineCmd {
    /// Run a pipeline: cached instances are reused, the rest run.
    Run {
        #[command(flatten)]
        plan: PlanArgs,
        /// Run only this stage and what it depends on (repeatable).
        #[arg(long)]
        until: Vec<String>,
        /// Rerun this stage even if cached (repeatable).
        #[arg(long)]
        force: Vec<String>,
        /// Print what would run and why, run nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value = "local")]
        executor: ExecutorKind,
        /// Parallel CPU slots (a stage takes `resources.cpus` of them); with `--executor slurm`, the
        /// CPUs of all submitted jobs together [default: local CPUs; 1000 with slurm].
        #[arg(short = 'j', long)]
        jobs: Option<usize>,
        /// Slurm profile (TOML: partition, account, qos, extra_args, ...) for `--executor slurm`
        /// [env: RREDCOT_SLURM_PROFILE].
        #[arg(long, value_name = "FILE")]
        profile: Option<PathBuf>,
        /// Keep running independent stages after a failure.
        #[arg(long)]
        keep_going: bool,
        /// Print the run summary as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Start a new process for every stage instance. By default the local executor runs
        /// builtin stages in warm processes that take one instance after another, so the worker
        /// loads libtorch (and, on a GPU, CUDA) once, not once per stage.
        #[arg(long)]
        fresh_processes: bool,
    },
    /// Which instances are cached, stale or missing, and why.
    Status {
        #[command(flatten)]
        plan: PlanArgs,
    },
    /// Print the DAG as text or Graphviz DOT.
    Dag {
        #[command(flatten)]
        plan: PlanArgs,
        #[arg(long, default_value = "text")]
        format: String,
    },
    /// Everything about one stage instance: kind, params and where they come from, inputs, key.
    Explain {
        #[command(flatten)]
        plan: PlanArgs,
        /// Stage or instance name.
        stage: String,
    },
}

#[derive(Subcommand)]
enum StageCmd {
    /// Run one planned instance by key and commit it (idempotent).
    Exec {
        key: String,
        /// Recompute even if committed (the old instance is quarantined, not deleted).
        #[arg(long)]
        force: bool,
    },
    /// Run the instances named on stdin (`exec [--force] KEY` lines) one after another in this
    /// process: what the local executor's warm processes run.
    #[command(hide = true)]
    Serve,
}

#[derive(Subcommand)]
enum ArtifactCmd {
    /// Show an instance's run record and the schema and first rows of its outputs.
    Show {
        /// Instance key (or unique prefix), or a path to a Parquet file.
        what: String,
        #[arg(long, default_value_t = 5)]
        rows: usize,
        /// Characters shown of a cell (a list of token ids runs to thousands); 0 = all.
        #[arg(long, default_value_t = 60)]
        width: usize,
    },
    /// Re-hash every committed instance and report corrupt ones.
    Verify {
        /// Move corrupt instances to quarantine so the next run recomputes them.
        #[arg(long)]
        fix: bool,
    },
    /// Remove instances that none of the given pipelines references.
    Gc {
        /// Pipelines whose current instances are kept.
        #[arg(required = true)]
        pipelines: Vec<PathBuf>,
        /// The `--set` of the runs to keep, as given to `pipeline run` (applied to every pipeline
        /// named).
        #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
        set: Vec<String>,
        #[arg(long)]
        dry_run: bool,
    },
}

/// Entry point; returns the process exit code.
pub fn main(rt: &Runtime, serve: Option<ServeFn>) -> i32 {
    // Printing into a closed pipe (`... | head`) ends the process quietly, as other CLI tools do.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let filter = if cli.verbose { "info" } else { "warn" };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RREDCOT_LOG")
                .unwrap_or_else(|_| filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not into a pipe or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    match dispatch(cli, rt, serve) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            // A `stage exec` stopped by SIGINT/SIGTERM says so in its exit code (128 + signal).
            e.downcast_ref::<EngineError>().map_or(1, EngineError::exit_code)
        }
    }
}

/// The store's directory, absolute: stage processes and external commands run in other working
/// directories (a stage file's own), so a relative store (the default one too) would name
/// another place there.
fn store_root(cli_store: &Option<PathBuf>) -> PathBuf {
    let root = cli_store
        .clone()
        .or_else(|| std::env::var_os("RREDCOT_STORE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".rredcot/store"));
    std::path::absolute(&root).unwrap_or(root)
}

fn load(args: &PlanArgs, rt: &Runtime) -> Result<Plan> {
    Ok(load_plan(&args.pipeline, &parse_sets(&args.sets)?, rt.catalog)?)
}

fn parse_sets(sets: &[String]) -> Result<Vec<SetArg>> {
    Ok(sets.iter().map(|s| SetArg::parse(s)).collect::<Result<Vec<_>, _>>()?)
}

/// Replaces this process by the worker binary `w` with `args`.
fn exec_worker(w: std::path::PathBuf, args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&w)
        .args(args)
        .exec();
    bail!("cannot exec {}: {err}", w.display())
}

fn dispatch(cli: Cli, rt: &Runtime, serve: Option<ServeFn>) -> Result<i32> {
    let root = store_root(&cli.store);
    match cli.cmd {
        Cmd::Serve(mut args) => {
            if let Some(file) = args.pipeline.take() {
                let p = load_plan(&file, &parse_sets(&std::mem::take(&mut args.sets))?, rt.catalog)?;
                let stage = args.model.to_string_lossy().to_string();
                let (dir, name) = served_checkpoint(&p, &root, &stage)?;
                args.model = dir;
                args.model_name.get_or_insert(name);
            }
            match serve {
                Some(f) => f(&args).map(|()| 0),
                None => exec_worker(Programs::of(rt).worker("`rredcot serve`").map_err(anyhow::Error::msg)?, args.command_line()),
            }
        }
        Cmd::Pipeline(PipelineCmd::Run {
            plan,
            until,
            force,
            dry_run,
            executor,
            jobs,
            profile,
            keep_going,
            json,
            fresh_processes,
        }) => {
            let p = load(&plan, rt)?;
            if matches!(executor, ExecutorKind::Local) && !fresh_processes {
                // Every warm process would refuse it: say so once, before anything runs.
                crate::engine::warm::max_instances().map_err(anyhow::Error::msg)?;
            }
            // A dry run writes nothing, not even a new store.
            let store = if dry_run {
                Store::existing(&root).unwrap_or_else(|_| Store::unopened(&root))
            } else {
                let store = Store::open(&root)?;
                for path in store.clean_stale() {
                    tracing::info!("removed {} (left by an interrupted writer)", path.display());
                }
                store
            };
            // Until the run ends: `artifact gc` waits its turn instead of removing what it reads.
            let _in_use = if dry_run { None } else { Some(store.in_use()?) };
            let slurm = matches!(executor, ExecutorKind::Slurm);
            if profile.is_some() && !slurm {
                bail!("--profile is for --executor slurm");
            }
            let profile = profile.or_else(|| {
                std::env::var_os("RREDCOT_SLURM_PROFILE")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            });
            // On Slurm, GPUs are requested per job (--gres); no local device slots.
            let gpus = if slurm { 0 } else { detect_gpus() };
            let default_jobs = if slurm {
                1000
            } else {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            };
            let opts = RunOptions {
                jobs: jobs.unwrap_or(default_jobs),
                until,
                force,
                dry_run,
                keep_going,
                gpus,
                verbose: cli.verbose,
            };
            // Ctrl-C/SIGTERM are recorded and handled by the runner (stop, then report).
            signals::install_handlers(true);
            let mut exec: Box<dyn crate::engine::runner::Executor> = match executor {
                ExecutorKind::Local => {
                    Box::new(LocalExecutor::new(store.clone(), Programs::of(rt), gpus > 0).fresh_processes(fresh_processes))
                }
                ExecutorKind::Slurm if dry_run => {
                    Box::new(LocalExecutor::new(store.clone(), Programs::of(rt), false))
                }
                ExecutorKind::Slurm => {
                    let prof = match &profile {
                        Some(f) => SlurmProfile::load(f)?,
                        None => SlurmProfile::default(),
                    };
                    Box::new(SlurmExecutor::new(&store, Programs::of(rt), prof)?)
                }
            };
            let summary = run_pipeline(&p, &store, &opts, exec.as_mut())?;
            // With --json, stdout carries only the summary (it has `would_run`).
            if dry_run && !json {
                for (name, why) in &summary.would_run {
                    println!("would run  {name}: {}", why.join("; "));
                }
                println!(
                    "dry run: {} would run, {} cached",
                    summary.would_run.len(),
                    summary.cached.len()
                );
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            }
            // A dry run said what it would do above; "0 ran" would read as a run that did nothing.
            if !dry_run {
                let counters = summary
                    .counters_by_kind
                    .iter()
                    .flat_map(|(kind, c)| c.iter().map(move |(k, v)| format!(" {kind}.{k}={v}")))
                    .collect::<String>();
                let reused = if summary.reused.is_empty() {
                    String::new()
                } else {
                    format!(", {} reused", summary.reused.len())
                };
                eprintln!(
                    "pipeline {}{}: {} ran, {} cached{reused}, {} failed, {} not run in {:.2}s{}",
                    p.name,
                    if summary.interrupted {
                        " interrupted"
                    } else {
                        ""
                    },
                    summary.ran.len(),
                    summary.cached.len(),
                    summary.failed.len(),
                    summary.not_run.len(),
                    summary.wall_s,
                    counters
                );
            }
            // Interrupted: 128 + the signal, as a shell reports it (130 for Ctrl-C, 143 for SIGTERM).
            Ok(match summary.signal {
                Some(sig) => 128 + sig,
                None if summary.interrupted => 130,
                None if !summary.failed.is_empty() => 1,
                None => 0,
            })
        }
        Cmd::Pipeline(PipelineCmd::Status { plan }) => {
            let p = load(&plan, rt)?;
            status(&p, &root)?;
            Ok(0)
        }
        Cmd::Pipeline(PipelineCmd::Dag { plan, format }) => {
            let p = load(&plan, rt)?;
            match format.as_str() {
                "text" => print!("{}", dag_text(&p)),
                "dot" => print!("{}", dag_dot(&p)),
                other => bail!("unknown format `{other}` (text, dot)"),
            }
            Ok(0)
        }
        Cmd::Report { plan, stage, out } => {
            let p = load(&plan, rt)?;
            let out = out.unwrap_or_else(|| PathBuf::from("reports").join(&p.name));
            let md = export_report(&p, &root, &stage, &out)?;
            print!("{md}");
            eprintln!("report copied to {}", out.display());
            Ok(0)
        }
        Cmd::Pipeline(PipelineCmd::Explain { plan, stage }) => {
            let p = load(&plan, rt)?;
            explain(&p, &root, &stage)?;
            Ok(0)
        }
        Cmd::Stage(StageCmd::Exec { key, force }) => {
            let store = Store::open(&root)?;
            let _in_use = store.in_use()?;
            let key = store.planned_key(&key)?;
            // SIGINT/SIGTERM kill us as before, except while an external command runs: then they
            // are passed on to its process group and nothing is committed.
            signals::install_handlers(false);
            match exec_instance(&store, &key, rt, force)? {
                ExecOutcome::NeedsWorker(w) => exec_worker(w, std::env::args_os().skip(1)),
                done => {
                    eprintln!("{}", done.summary());
                    Ok(0)
                }
            }
        }
        Cmd::Stage(StageCmd::Serve) => Ok(crate::engine::warm::serve(&Store::open(&root)?, rt)?),
        Cmd::Artifact(ArtifactCmd::Show { what, rows, width }) => {
            show(&root, &what, rows, width)?;
            Ok(0)
        }
        Cmd::Artifact(ArtifactCmd::Verify { fix }) => {
            let store = Store::existing(&root)?;
            let report = verify_store(&store)?;
            for (key, why) in &report.corrupt {
                println!("CORRUPT {} {why}", short(key));
            }
            for (key, why) in &report.suspect {
                println!("SUSPECT {} {why}", short(key));
            }
            if fix {
                for (key, why) in report.corrupt.iter().chain(&report.suspect) {
                    let _lock = store.lock(key)?;
                    let dest = store.quarantine(key, why)?;
                    println!("  {} moved to {}", short(key), dest.display());
                }
            }
            let (bad, sus) = (report.corrupt.len(), report.suspect.len());
            println!("verified {} instances: {} ok, {bad} corrupt, {sus} built from a corrupt or changed input", report.total, report.total - bad - sus);
            Ok(if bad + sus > 0 { 1 } else { 0 })
        }
        Cmd::Artifact(ArtifactCmd::Gc { pipelines, set, dry_run }) => {
            let store = Store::existing(&root)?;
            let sets = parse_sets(&set)?;
            // Whatever a run is reading stays: gc waits for no one, it says so and stops.
            let _alone = match store.try_alone()? {
                Some(lock) => lock,
                None => bail!("a pipeline run or stage exec is using the store {}: gc would remove instances it is about to read; run gc when it has ended", store.root.display()),
            };
            let mut keep = std::collections::HashSet::new();
            for p in &pipelines {
                let plan = load_plan(p, &sets, rt.catalog)?;
                keep.extend(referenced_keys(&plan, &store)?);
            }
            let (mut kept, mut removed) = (0, 0);
            for key in store.instance_keys()? {
                if keep.contains(&key) {
                    kept += 1;
                    continue;
                }
                removed += 1;
                println!(
                    "{} {}",
                    if dry_run { "would remove" } else { "remove" },
                    short(&key)
                );
                if !dry_run {
                    let _lock = store.lock(&key)?;
                    std::fs::remove_dir_all(store.instance_dir(&key))
                        .with_context(|| format!("removing instance {key}"))?;
                    let _ = std::fs::remove_file(store.spec_path(&key));
                    let _ = std::fs::remove_file(store.log_path(&key));
                }
            }
            println!("gc: kept {kept}, {} {removed}", if dry_run { "would remove" } else { "removed" });
            // After the instances: their outputs' remembered hashes go with them.
            let hashes = FileHashes::prune(&store.root, dry_run)?;
            println!(
                "gc: remembered hashes of large files: kept {}, {} {} (their file is gone or changed)",
                hashes.kept,
                if dry_run { "would remove" } else { "removed" },
                hashes.removed
            );
            Ok(0)
        }
    }
}

/// What `artifact verify` found: instance key -> why.
struct VerifyReport {
    total: usize,
    /// Its own files do not match its run record (or the record is unreadable).
    corrupt: Vec<(String, String)>,
    /// Built from an upstream output that is corrupt now (by a build that did not re-hash its
    /// inputs before reading them) or that is no longer what its record says it read.
    suspect: Vec<(String, String)>,
}

fn verify_store(store: &Store) -> Result<VerifyReport> {
    let keys = store.instance_keys()?;
    let mut records = BTreeMap::new();
    let mut corrupt = Vec::new();
    for key in &keys {
        match store.read_record(key) {
            Ok(Some(rec)) => {
                if let Err(why) = store.verify(&rec) {
                    corrupt.push((key.clone(), why));
                }
                records.insert(key.clone(), rec);
            }
            Ok(None) => {}
            Err(why) => corrupt.push((key.clone(), why)),
        }
    }
    let bad: std::collections::HashSet<&String> = corrupt.iter().map(|(k, _)| k).collect();
    let mut suspect = Vec::new();
    for (key, rec) in &records {
        if bad.contains(key) {
            continue;
        }
        for (name, inp) in &rec.inputs {
            let crate::engine::spec::InputSource::Instance {
                key: up,
                stage,
                output,
            } = &inp.source
            else {
                continue;
            };
            let why = match records.get(up).and_then(|u| u.outputs.get(output)) {
                Some(o) if o.hash != inp.hash => Some(format!(
                    "input `{name}`: upstream {stage} ({}) output `{output}` now has hash {}, but this instance was built from {}",
                    short(up),
                    short(&o.hash),
                    short(&inp.hash)
                )),
                // A build that re-hashed its inputs first never read the corrupt bytes.
                Some(_) if bad.contains(up) && !rec.inputs_verified => Some(format!(
                    "input `{name}`: upstream {stage} ({}) is corrupt, and this instance was built without re-hashing its inputs (it may have read the corrupt bytes)",
                    short(up)
                )),
                _ => None,
            };
            if let Some(why) = why {
                suspect.push((key.clone(), why));
                break;
            }
        }
    }
    Ok(VerifyReport {
        total: keys.len(),
        corrupt,
        suspect,
    })
}

fn status(p: &Plan, root: &Path) -> Result<()> {
    let store = Store::existing(root)?;
    let refs = store.read_refs(&p.name);
    let mut resolver = Resolver::new(p, FileHashes::in_store(&store.root, false));
    let mut done = vec![None; p.nodes.len()];
    let mut counts = BTreeMap::new();
    for &i in &p.order {
        let node = &p.nodes[i];
        let ups = resolver.upstream(i);
        let (state, why) = if let Some(&u) = ups.iter().find(|&&u| done[u].is_none()) {
            let state = if refs.contains_key(&node.name) {
                "stale"
            } else {
                "missing"
            };
            (
                state,
                format!("upstream `{}` is not up to date", p.nodes[u].name),
            )
        } else {
            let spec = resolver.spec(i, &done)?;
            match store.record(&spec.key) {
                Some(rec) if store.quick_check(&rec).is_ok() => {
                    done[i] = Some(std::sync::Arc::new(rec));
                    ("cached", short(&spec.key).to_string())
                }
                other => {
                    let why = why_not_cached(&store, &refs, &spec).join("; ");
                    let state = if other.is_some() || refs.contains_key(&node.name) {
                        "stale"
                    } else {
                        "missing"
                    };
                    (state, why)
                }
            }
        };
        *counts.entry(state).or_insert(0) += 1;
        println!("{state:8} {:28} {why}", node.name);
    }
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("{}: {}", p.name, parts.join(", "));
    Ok(())
}

/// The run record of every instance whose inputs and own output are committed and unchanged.
fn committed(
    p: &Plan,
    store: &Store,
) -> Result<Vec<Option<std::sync::Arc<crate::engine::record::RunRecord>>>> {
    let mut resolver = Resolver::new(p, FileHashes::in_store(&store.root, false));
    let mut done = vec![None; p.nodes.len()];
    for &i in &p.order {
        if resolver.upstream(i).iter().all(|&u| done[u].is_some()) {
            let spec = resolver.spec(i, &done)?;
            done[i] = store
                .record(&spec.key)
                .filter(|r| store.quick_check(r).is_ok())
                .map(std::sync::Arc::new);
        }
    }
    Ok(done)
}

/// `serve --pipeline P --model SPEC`: the checkpoint directory of stage output `SPEC` (`STAGE`,
/// whose one checkpoint output is meant, or `STAGE.OUTPUT`) in the store, and the model id
/// `STAGE.OUTPUT`. The stage must be up to date, as `report` requires.
fn served_checkpoint(p: &Plan, root: &Path, spec: &str) -> Result<(PathBuf, String)> {
    let find = |name: &str| p.nodes.iter().position(|n| n.name == name);
    let (i, output) = match find(spec) {
        Some(i) => (i, None),
        None => match spec.rsplit_once('.').and_then(|(s, o)| Some((find(s)?, o))) {
            Some((i, o)) => (i, Some(o.to_string())),
            None => bail!("{}", no_stage(spec, &p.file, &p.stage_names())),
        },
    };
    let n = &p.nodes[i];
    let checkpoints: Vec<&str> = n.kind.outputs.iter().filter(|(_, s)| s.name == "checkpoint").map(|(k, _)| k.as_str()).collect();
    let output = match (output, checkpoints.as_slice()) {
        (Some(o), _) if checkpoints.contains(&o.as_str()) => o,
        (_, []) => bail!("stage `{}` ({}) has no checkpoint output to serve", n.name, n.kind.name),
        (Some(o), _) => bail!("stage `{}` ({}) has no checkpoint output `{o}` (its checkpoint outputs: {})", n.name, n.kind.name, name_list(&checkpoints)),
        (None, [one]) => one.to_string(),
        (None, many) => bail!("stage `{}` has several checkpoint outputs: name one as `{}.OUTPUT` ({})", n.name, n.name, name_list(many)),
    };
    let store = Store::existing(root)?;
    let rec = up_to_date(p, &store, i)?;
    Ok((store.outputs_dir(&rec.key).join(&output), format!("{}.{output}", n.name)))
}

/// The run record of node `i` if it is committed with its current inputs, else an error that
/// says to run the pipeline.
fn up_to_date(p: &Plan, store: &Store, i: usize) -> Result<std::sync::Arc<crate::engine::record::RunRecord>> {
    committed(p, store)?[i].clone().with_context(|| {
        format!(
            "stage `{}` of {} is not up to date in {}: run `rredcot pipeline run {}` first (`pipeline status` says why)",
            p.nodes[i].name,
            p.file.display(),
            store.root.display(),
            p.file.display()
        )
    })
}

/// Copies the `report` output of stage `stage` into `out` (replacing what was there) and returns
/// its results.md.
fn export_report(p: &Plan, root: &Path, stage: &str, out: &Path) -> Result<String> {
    let i = p
        .nodes
        .iter()
        .position(|n| n.name == stage)
        .with_context(|| no_stage(stage, &p.file, &p.stage_names()))?;
    let store = Store::existing(root)?;
    let rec = up_to_date(p, &store, i)?;
    let src = store.outputs_dir(&rec.key).join("report");
    if !src.is_dir() {
        bail!(
            "stage `{stage}` ({}) has no `report` directory output",
            short(&rec.key)
        );
    }
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("replacing {}", out.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for e in std::fs::read_dir(&src)? {
        let e = e?;
        std::fs::copy(e.path(), out.join(e.file_name()))
            .with_context(|| format!("copying {}", e.path().display()))?;
    }
    std::fs::read_to_string(out.join("results.md"))
        .with_context(|| format!("{}: no results.md", src.display()))
}

fn input_label(p: &Plan, r: &InputRef) -> String {
    match r {
        InputRef::Output { node, output } => format!("{}.{}", p.nodes[*node].name, output),
        InputRef::File { path } => format!("file:{}", path.display()),
    }
}

fn dag_text(p: &Plan) -> String {
    let mut s = String::new();
    for &i in &p.order {
        let n = &p.nodes[i];
        let ins: Vec<String> = n
            .inputs
            .iter()
            .map(|(k, r)| format!("{k} <- {}", input_label(p, r)))
            .collect();
        s.push_str(&format!("{} [{}]", n.name, n.kind.name));
        if !ins.is_empty() {
            s.push_str(&format!("  ({})", ins.join(", ")));
        }
        s.push('\n');
    }
    s
}

fn dag_dot(p: &Plan) -> String {
    let mut s = format!("digraph \"{}\" {{\n  rankdir=LR;\n", p.name);
    for n in &p.nodes {
        s.push_str(&format!(
            "  \"{}\" [shape=box, label=\"{}\\n({})\"];\n",
            n.name, n.name, n.kind.name
        ));
    }
    for n in &p.nodes {
        for (k, r) in &n.inputs {
            match r {
                InputRef::Output { node, output } => s.push_str(&format!(
                    "  \"{}\" -> \"{}\" [label=\"{output}→{k}\"];\n",
                    p.nodes[*node].name, n.name
                )),
                InputRef::File { path } => s.push_str(&format!(
                    "  \"{}\" [shape=note];\n  \"{}\" -> \"{}\" [label=\"{k}\"];\n",
                    path.display(),
                    path.display(),
                    n.name
                )),
            }
        }
    }
    s.push_str("}\n");
    s
}

fn explain(p: &Plan, root: &Path, stage: &str) -> Result<()> {
    let idx = p.matching(stage);
    if idx.is_empty() {
        bail!("no stage or instance `{stage}` in {} (its stages: {})", p.file.display(), p.stage_names());
    }
    // Read-only: on a store that does not exist yet, everything reads as not cached.
    let store = Store::existing(root).unwrap_or_else(|_| Store::unopened(root));
    let refs = store.read_refs(&p.name);
    let mut resolver = Resolver::new(p, FileHashes::in_store(&store.root, false));
    let mut done = vec![None; p.nodes.len()];
    for &i in &p.order {
        let ups = resolver.upstream(i);
        let spec = if ups.iter().all(|&u| done[u].is_some()) {
            Some(resolver.spec(i, &done)?)
        } else {
            None
        };
        if let Some(s) = &spec {
            done[i] = store
                .record(&s.key)
                .filter(|r| store.quick_check(r).is_ok())
                .map(std::sync::Arc::new);
        }
        if !idx.contains(&i) {
            continue;
        }
        let n = &p.nodes[i];
        println!("instance   {}", n.name);
        println!("kind       {} ({})", n.kind.name, n.kind.file.display());
        if !n.kind.description.is_empty() {
            println!("           {}", n.kind.description);
        }
        match &n.kind.runner {
            crate::engine::plan::Runner::Builtin { .. } => println!("code       {}", n.kind.code_version),
            // An external stage's code is its command and script: their bytes are in the key too.
            crate::engine::plan::Runner::External { .. } => {
                // Hashed only when the kind has a script.
                let script_hash = match spec.as_ref().map(|s| &s.runner) {
                    Some(crate::engine::spec::RunnerSpec::External { script_sha256: Some(h), .. }) => format!(", script sha256 {}", short(h)),
                    _ => String::new(),
                };
                println!("code       version {} (the stage file's), the command{script_hash}", n.kind.code_version)
            }
        }
        match &n.kind.runner {
            crate::engine::plan::Runner::Builtin { name, in_worker } => {
                println!(
                    "runs       builtin `{name}`{}",
                    if *in_worker { " (ML worker)" } else { "" }
                )
            }
            crate::engine::plan::Runner::External {
                command, script, ..
            } => {
                println!(
                    "runs       {}{}",
                    match command {
                        crate::engine::defs::Command::Shell(line) => format!("sh -c {line:?}"),
                        crate::engine::defs::Command::Argv(argv) => format!("{argv:?}"),
                    },
                    script
                        .as_ref()
                        .map(|s| format!(" (script {})", s.display()))
                        .unwrap_or_default()
                )
            }
        }
        println!(
            "resources  cpus={} gpus={} mem={}",
            n.kind.resources.cpus,
            n.kind.resources.gpus,
            n.kind.resources.mem.clone().unwrap_or("-".into())
        );
        println!("params");
        for (k, v) in &n.params {
            let src = match n.param_sources.get(k) {
                Some(ParamSource::Default) => "default",
                Some(ParamSource::Pipeline) => "pipeline",
                Some(ParamSource::SetArg) => "--set",
                None => "?",
            };
            println!("  {k} = {v}  ({src})");
        }
        println!("inputs");
        for (k, r) in &n.inputs {
            let schema = n.kind.input_schema(k).map(|s| s.name()).unwrap_or("?");
            let hash = spec
                .as_ref()
                .and_then(|s| s.inputs.get(k))
                .map(|i| short(&i.hash).to_string())
                .unwrap_or("(not computed yet)".into());
            println!("  {k} ({schema}) <- {}  hash {hash}", input_label(p, r));
        }
        println!("outputs");
        for (k, s) in &n.kind.outputs {
            println!("  {k} ({s})");
        }
        match &spec {
            Some(s) => {
                let state = if done[i].is_some() {
                    "cached".to_string()
                } else {
                    format!(
                        "not cached: {}",
                        why_not_cached(&store, &refs, s).join("; ")
                    )
                };
                println!("key        {}", s.key);
                println!("status     {state}");
                if done[i].is_some() {
                    println!("outputs at {}", store.outputs_dir(&s.key).display());
                }
            }
            None => println!("key        (depends on upstream outputs that are not computed yet)"),
        }
        println!();
    }
    Ok(())
}

fn show(root: &Path, what: &str, rows: usize, width: usize) -> Result<()> {
    let path = PathBuf::from(what);
    if path.is_file() {
        return show_parquet(&path, rows, width);
    }
    let store = Store::existing(root)?;
    let matches: Vec<String> = store
        .instance_keys()?
        .into_iter()
        .filter(|k| k.starts_with(what))
        .collect();
    let key = match matches.as_slice() {
        [k] => k.clone(),
        [] => bail!(
            "no instance with key prefix `{what}` in {} (and no such file)",
            root.display()
        ),
        many => bail!(
            "key prefix `{what}` is ambiguous ({} instances)",
            many.len()
        ),
    };
    let rec = store
        .record(&key)
        .with_context(|| format!("instance {key} has no run record (incomplete)"))?;
    println!("instance {} [{}] key {}", rec.stage, rec.kind, rec.key);
    println!(
        "pipeline {}  ran {} on {} in {:.2}s, peak RSS {:.0} MB",
        rec.pipeline, rec.start, rec.host, rec.wall_s, rec.peak_rss_mb
    );
    println!("params   {}", serde_json::Value::Object(rec.params.clone()));
    if !rec.counters.is_empty() {
        println!("counters {:?}", rec.counters);
    }
    for (name, o) in &rec.outputs {
        println!("\noutput `{name}` ({}) hash {}", o.schema, short(&o.hash));
        let schema = Schema::parse(&o.schema).unwrap_or(Schema::Dir);
        let p = schema.output_path(&store.outputs_dir(&key), name);
        if schema.is_tabular() {
            show_parquet(&p, rows, width)?;
        } else {
            for f in &o.files {
                println!("  {} ({} bytes)", f.path, f.bytes);
            }
        }
    }
    Ok(())
}

fn show_parquet(path: &Path, rows: usize, width: usize) -> Result<()> {
    let batch = crate::artifact::read_batches(path)?;
    println!("{} rows; schema:", batch.num_rows());
    for f in batch.schema().fields() {
        println!(
            "  {}: {}{}",
            f.name(),
            f.data_type(),
            if f.is_nullable() { " (nullable)" } else { "" }
        );
    }
    let head = batch.slice(0, rows.min(batch.num_rows()));
    println!("{}", arrow::util::pretty::pretty_format_batches(&[shortened(&head, width)?])?);
    Ok(())
}

/// The batch with every cell as its text, cut to `width` characters (0: whole) and saying how
/// long it was.
fn shortened(batch: &arrow::array::RecordBatch, width: usize) -> Result<arrow::array::RecordBatch> {
    use arrow::array::{ArrayRef, StringArray};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    if width == 0 {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default().with_null("null");
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (f, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let fmt = ArrayFormatter::try_new(col.as_ref(), &options)?;
        let cells: Vec<String> = (0..col.len())
            .map(|i| {
                let text = fmt.value(i).to_string();
                let n = text.chars().count();
                if n <= width {
                    return text;
                }
                let items = col.as_any().downcast_ref::<arrow::array::ListArray>().map(|l| format!("{} items, ", l.value_length(i)));
                format!("{}… ({}{n} chars)", text.chars().take(width).collect::<String>(), items.unwrap_or_default())
            })
            .collect();
        fields.push(arrow::datatypes::Field::new(f.name(), arrow::datatypes::DataType::Utf8, true));
        columns.push(std::sync::Arc::new(StringArray::from(cells)));
    }
    Ok(arrow::array::RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns)?)
}
