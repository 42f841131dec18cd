//! From a pipeline file to a checked DAG of stage instances.
//!
//! Loading resolves stage kinds, unrolls chains into `chain.stage[i]` instances, applies
//! `--set` overrides, type-checks params against the kind's defaults, wires inputs and rejects
//! cycles (naming them). Nothing here touches the store: keys need upstream outputs and are
//! computed by the runner.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::defs::{
    parse_toml_file, ChainDef, Command, PipelineFile, Resources, StageKindFile, StageUse,
};
use super::error::{EngineError, Result};
use super::programs::Executable;
use super::catalog::Catalog;
use super::schema::SchemaInfo;

#[derive(Debug, Clone)]
pub enum Runner {
    Builtin {
        name: String,
        in_worker: bool,
    },
    External {
        command: Command,
        script: Option<PathBuf>,
        workdir: PathBuf,
    },
}

#[derive(Debug, Clone)]
pub struct StageKind {
    pub name: String,
    pub file: PathBuf,
    pub description: String,
    pub runner: Runner,
    /// Code version entering the cache key (builtin version + the stage file's `version`).
    pub code_version: String,
    pub inputs: BTreeMap<String, SchemaInfo>,
    /// Input groups: wired as `group.label` (see `StageKindFile::input_groups`).
    pub input_groups: BTreeMap<String, SchemaInfo>,
    pub outputs: BTreeMap<String, SchemaInfo>,
    pub defaults: Map<String, Value>,
    pub resources: Resources,
}

impl StageKind {
    /// The schema of a wired input name: a declared input, or a member `group.label` of a group.
    pub fn input_schema(&self, name: &str) -> Option<SchemaInfo> {
        self.inputs
            .get(name)
            .copied()
            .or_else(|| self.input_groups.get(name.split_once('.')?.0).copied())
    }

    fn describe_inputs(&self) -> String {
        let mut names: Vec<String> = self.inputs.keys().cloned().collect();
        names.extend(
            self.input_groups
                .keys()
                .map(|g| format!("{g}.<label> (group)")),
        );
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum InputRef {
    Output { node: usize, output: String },
    File { path: PathBuf },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamSource {
    Default,
    Pipeline,
    SetArg,
}

#[derive(Debug, Clone)]
pub struct Node {
    /// Instance name: `stage` or `chain.stage[i]`.
    pub name: String,
    /// `stage` or `chain.stage` (what `--set` and `--until` match besides the instance name).
    pub base: String,
    /// The stage's own name (without chain prefix and step).
    pub stage: String,
    pub step: Option<usize>,
    pub kind: Arc<StageKind>,
    pub params: Map<String, Value>,
    pub param_sources: BTreeMap<String, ParamSource>,
    pub inputs: BTreeMap<String, InputRef>,
    /// The kind's resources with the pipeline's `resources` of this use over them.
    pub resources: Resources,
}

#[derive(Debug)]
pub struct Plan {
    pub name: String,
    pub file: PathBuf,
    pub nodes: Vec<Node>,
    pub graph: DiGraph<usize, ()>,
    /// Node indices in a topological order.
    pub order: Vec<usize>,
}

/// `SetArg::param` of an input override (`--set stage.inputs.NAME=REF`).
const INPUT_SET_PREFIX: &str = "inputs.";

/// What may stand between a `--set` target and its param: `stage.params.NAME` = `stage.NAME`.
const PARAMS_SET_INFIX: &str = ".params.";

/// The distinct names in `names`, in order, as one line: what an unknown stage name is told
/// to choose from.
pub fn name_list<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .map(|n| n.as_ref().to_string())
        .filter(|n| seen.insert(n.clone()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The message for `name`, which names no stage of pipeline `file` (`stages`: [`name_list`]).
pub fn no_stage(name: &str, file: &Path, stages: &str) -> String {
    format!("no stage `{name}` in {} (its stages: {stages})", file.display())
}

/// A parsed `--set target.param=value` (or `target.inputs.NAME=REF`).
#[derive(Debug, Clone)]
pub struct SetArg {
    pub raw: String,
    pub target: String,
    pub param: String,
    pub value: toml::Value,
    pub text: String,
}

impl SetArg {
    pub fn parse(raw: &str) -> Result<SetArg> {
        let bad = |m: &str| EngineError::SetArg {
            arg: raw.to_string(),
            message: m.to_string(),
        };
        let (lhs, text) = raw
            .split_once('=')
            .ok_or_else(|| bad("expected stage.param=value"))?;
        // `stage.inputs.NAME=REF` rewires an input (NAME may be a group member `group.label`).
        if let Some((target, input)) = lhs.trim().split_once(".inputs.") {
            if target.is_empty() || input.is_empty() {
                return Err(bad("expected stage.inputs.NAME=stage.output or file:path"));
            }
            let text = match text.trim().strip_prefix("file:") {
                Some(path) if path.trim().is_empty() => return Err(bad("`file:` names no path")),
                // Relative to where the command runs, not to the pipeline file.
                Some(path) => format!(
                    "file:{}",
                    std::env::current_dir()
                        .map(|d| d.join(path))
                        .unwrap_or_else(|_| path.into())
                        .display()
                ),
                None => text.trim().to_string(),
            };
            return Ok(SetArg {
                raw: raw.to_string(),
                target: target.to_string(),
                param: format!("{INPUT_SET_PREFIX}{input}"),
                value: toml::Value::String(text.clone()),
                text,
            });
        }
        // `stage.params.NAME=VALUE` is `stage.NAME=VALUE`, as the pipeline file writes a stage's
        // `params = { NAME = … }` beside its `inputs`.
        let lhs = lhs.trim();
        let (target, param) = match lhs.split_once(PARAMS_SET_INFIX) {
            Some((target, param)) if !param.contains('.') => (target, param),
            _ => lhs.rsplit_once('.').ok_or_else(|| bad("expected stage.param=value"))?,
        };
        if target.is_empty() || param.is_empty() {
            return Err(bad("expected stage.param=value"));
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {text}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(text.to_string()));
        Ok(SetArg {
            raw: raw.to_string(),
            target: target.to_string(),
            param: param.to_string(),
            value,
            text: text.to_string(),
        })
    }
}

pub fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "integer",
        toml::Value::Float(_) => "float",
        toml::Value::Boolean(_) => "boolean",
        toml::Value::Datetime(_) => "datetime",
        toml::Value::Array(_) => "array",
        toml::Value::Table(_) => "table",
    }
}

/// Coerce `value` to the type of `default`, or explain why not.
fn coerce(
    default: &toml::Value,
    value: &toml::Value,
    raw_text: Option<&str>,
) -> std::result::Result<toml::Value, String> {
    use toml::Value as T;
    let coerced = match (default, value) {
        (T::Float(_), T::Integer(i)) => Ok(T::Float(*i as f64)),
        (T::String(_), v) if !matches!(v, T::String(_)) => match raw_text {
            Some(text) => Ok(T::String(text.to_string())),
            None => Err(format!("expected string, got {}", type_name(v))),
        },
        (d, v) if type_name(d) == type_name(v) => Ok(v.clone()),
        (d, v) => Err(format!(
            "expected {}, got {} `{}`",
            type_name(d),
            type_name(v),
            v
        )),
    }?;
    // A key is hashed from JSON, which has no NaN or infinity (they would all read as null).
    if !finite(&coerced) {
        return Err(format!("`{value}`: NaN and infinity are not allowed in params"));
    }
    Ok(coerced)
}

/// Whether every float in `v` is finite.
fn finite(v: &toml::Value) -> bool {
    match v {
        toml::Value::Float(f) => f.is_finite(),
        toml::Value::Array(a) => a.iter().all(finite),
        toml::Value::Table(t) => t.values().all(finite),
        _ => true,
    }
}

/// The tables of a stage file that `extends` merges entry by entry.
const MERGED_TABLES: &[&str] = &["inputs", "input_groups", "outputs", "params", "resources"];

/// Load every stage kind file referenced by a pipeline.
struct KindLoader<'a> {
    dirs: Vec<PathBuf>,
    catalog: &'a Catalog,
    cache: HashMap<String, Arc<StageKind>>,
}

impl KindLoader<'_> {
    fn load(&mut self, pipeline_file: &Path, stage: &str, kind: &str) -> Result<Arc<StageKind>> {
        if let Some(k) = self.cache.get(kind) {
            return Ok(k.clone());
        }
        let file = self.find(pipeline_file, stage, kind)?;
        // Parsed once, with line-and-column errors; a file that extends another is read again as
        // a table to lay over its parents.
        let mut def: StageKindFile = parse_toml_file(&file)?;
        if def.extends.is_some() {
            let merged = self.with_parents(&file, &mut vec![kind.to_string()])?;
            def = StageKindFile::deserialize(toml::Value::Table(merged))
                .map_err(|e| EngineError::Parse { path: file.clone(), message: format!("{} (after applying `extends`)", e.message().trim()) })?;
        }
        let k = Arc::new(self.build(&file, kind, def)?);
        self.cache.insert(kind.to_string(), k.clone());
        Ok(k)
    }

    /// The file of stage kind `kind`, or an error naming where it was looked for and what exists.
    fn find(&self, from: &Path, stage: &str, kind: &str) -> Result<PathBuf> {
        if let Some(file) = self.dirs.iter().map(|d| d.join(format!("{kind}.toml"))).find(|p| p.is_file()) {
            return Ok(file);
        }
        let mut known: Vec<String> = self
            .dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .flatten()
            .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().to_string()))
            .collect();
        known.sort();
        known.dedup();
        Err(EngineError::UnknownKind {
            path: from.to_path_buf(),
            stage: stage.to_string(),
            kind: kind.to_string(),
            searched: self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            known: known.join(", "),
        })
    }

    /// A stage file with `extends = "KIND"`: that kind's file (itself perhaps extending another)
    /// with this one laid over it: the tables `inputs`, `input_groups`, `outputs`, `params` and
    /// `resources` entry by entry, everything else replaced. A file without `extends` as it is.
    fn with_parents(&self, file: &Path, seen: &mut Vec<String>) -> Result<toml::Table> {
        let mut table: toml::Table = parse_toml_file(file)?;
        let Some(parent) = table.remove("extends") else {
            return Ok(table);
        };
        let perr = |message: String| EngineError::Parse { path: file.to_path_buf(), message };
        let parent = parent.as_str().ok_or_else(|| perr("`extends` must be the name of a stage kind".into()))?.to_string();
        if seen.contains(&parent) {
            seen.push(parent);
            return Err(perr(format!("`extends` makes a cycle: {}", seen.join(" -> "))));
        }
        seen.push(parent.clone());
        let parent_file = self.find(file, &parent, &parent)?;
        let mut base = self.with_parents(&parent_file, seen)?;
        // A script is relative to the file that names it.
        if let Some(toml::Value::String(script)) = base.get("script") {
            let abs = parent_file.parent().unwrap_or(Path::new(".")).join(script);
            base.insert("script".into(), toml::Value::String(abs.display().to_string()));
        }
        for (k, v) in table {
            match (base.get_mut(&k), v) {
                (Some(toml::Value::Table(b)), toml::Value::Table(over)) if MERGED_TABLES.contains(&k.as_str()) => b.extend(over),
                (_, v) => {
                    base.insert(k, v);
                }
            }
        }
        Ok(base)
    }

    fn build(&self, file: &Path, kind: &str, def: StageKindFile) -> Result<StageKind> {
        let perr = |m: String| EngineError::Parse {
            path: file.to_path_buf(),
            message: m,
        };
        let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let (runner, code_version) = match (&def.builtin, &def.command) {
            (Some(b), None) => {
                let info = self.catalog.builtin(b).ok_or_else(|| EngineError::UnknownBuiltin {
                    path: file.to_path_buf(),
                    kind: kind.to_string(),
                    builtin: b.clone(),
                    known: self.catalog.builtin_names(),
                })?;
                (
                    Runner::Builtin {
                        name: b.clone(),
                        in_worker: info.runs_in == Executable::Worker,
                    },
                    format!("{}@{}+{}", b, info.version, def.version),
                )
            }
            (None, Some(cmd)) => {
                let script = def.script.as_ref().map(|s| dir.join(s));
                if let Some(s) = &script {
                    if !s.is_file() {
                        return Err(perr(format!("script `{}` not found", s.display())));
                    }
                }
                (
                    Runner::External {
                        command: cmd.clone(),
                        script,
                        workdir: dir.clone(),
                    },
                    def.version.clone(),
                )
            }
            (Some(_), Some(_)) => {
                return Err(perr(
                    "a stage kind has either `builtin` or `command`, not both".into(),
                ))
            }
            (None, None) => {
                return Err(perr(
                    "a stage kind needs `builtin = \"name\"` or `command = [...]`".into(),
                ))
            }
        };
        let schemas =
            |m: &BTreeMap<String, String>, what: &str| -> Result<BTreeMap<String, SchemaInfo>> {
                m.iter()
                    .map(|(n, s)| {
                        self.catalog.schema(s).map(|sc| (n.clone(), sc)).ok_or_else(|| {
                            perr(format!(
                                "{what} `{n}` has unknown schema `{s}` (known: {})",
                                self.catalog.schema_names()
                            ))
                        })
                    })
                    .collect()
            };
        def.resources.time_limit().map_err(&perr)?;
        if let Some(name) = &def.name {
            if name != kind {
                return Err(perr(format!(
                    "file declares name `{name}` but is loaded as stage kind `{kind}`"
                )));
            }
        }
        Ok(StageKind {
            name: kind.to_string(),
            file: file.to_path_buf(),
            description: def.description.clone(),
            runner,
            code_version,
            inputs: schemas(&def.inputs, "input")?,
            input_groups: schemas(&def.input_groups, "input group")?,
            outputs: schemas(&def.outputs, "output")?,
            defaults: def
                .params
                .iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
            resources: def.resources.clone(),
        })
    }
}

/// A stage use before wiring: which kind, which params, which raw input refs.
struct Pending {
    node: Node,
    raw_inputs: BTreeMap<String, String>,
    /// Chain name and chain-local stage names, to resolve sibling references.
    scope: Option<(String, Vec<String>, usize)>,
    carry: BTreeMap<String, String>,
}

/// One stage kind from the files in `dirs` (its `extends` applied), without a pipeline.
pub fn load_stage_kind(dirs: &[PathBuf], kind: &str, catalog: &Catalog) -> Result<Arc<StageKind>> {
    let mut loader = KindLoader { dirs: dirs.to_vec(), catalog, cache: HashMap::new() };
    let from = dirs.first().cloned().unwrap_or_default();
    loader.load(&from, kind, kind)
}

pub fn load_plan(file: &Path, sets: &[SetArg], catalog: &Catalog) -> Result<Plan> {
    let pf: PipelineFile = parse_toml_file(file)?;
    let pdir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let pdir = if pdir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        pdir
    };
    let name = pf.name.clone().unwrap_or_else(|| {
        file.file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string()
    });
    let mut dirs: Vec<PathBuf> = pf.stage_dirs.iter().map(|d| pdir.join(d)).collect();
    if let Some(d) = dirs.iter().find(|d| !d.is_dir()) {
        return Err(EngineError::Parse { path: file.to_path_buf(), message: format!("stage_dirs: `{}` is not a directory", d.display()) });
    }
    dirs.push(pdir.join("../stages"));
    dirs.push(pdir.join("stages"));
    dirs.push(PathBuf::from("stages"));
    let mut loader = KindLoader {
        dirs,
        catalog,
        cache: HashMap::new(),
    };
    let wiring = |stage: &str, m: String| EngineError::Wiring {
        path: file.to_path_buf(),
        stage: stage.to_string(),
        message: m,
    };

    // Chain lengths may be overridden with `--set chain.repeat=N`.
    let mut chains: Vec<ChainDef> = pf.chain.clone();
    for s in sets.iter().filter(|s| s.param == "repeat") {
        if let Some(c) = chains.iter_mut().find(|c| c.name == s.target) {
            c.repeat = match &s.value {
                toml::Value::Integer(n) if *n >= 0 => *n as usize,
                _ => {
                    return Err(EngineError::SetArg {
                        arg: s.raw.clone(),
                        message: "repeat must be a non-negative integer".into(),
                    })
                }
            };
        }
    }

    // `--set STAGE.uses=KIND` swaps a stage's kind (e.g. σ scoring for MC values, same outputs).
    let mut stages: Vec<StageUse> = pf.stage.clone();
    for s in sets.iter().filter(|s| s.param == "uses") {
        let kind = s.value.as_str().unwrap_or(&s.text).to_string();
        let mut hit = 0;
        let targets =
            stages
                .iter_mut()
                .filter(|su| su.name == s.target)
                .chain(chains.iter_mut().flat_map(|c| {
                    let chain = c.name.clone();
                    c.stage.iter_mut().filter(move |su| {
                        s.target == su.name || s.target == format!("{chain}.{}", su.name)
                    })
                }));
        for su in targets {
            su.uses = Some(kind.clone());
            su.kind_swapped = true;
            hit += 1;
        }
        if hit == 0 {
            return Err(EngineError::SetArg {
                arg: s.raw.clone(),
                message: no_stage(
                    &s.target,
                    file,
                    &name_list(pf.stage.iter().map(|su| su.name.clone()).chain(
                        chains.iter().flat_map(|c| c.stage.iter().map(move |su| format!("{}.{}", c.name, su.name))),
                    )),
                ),
            });
        }
    }

    let mut pending: Vec<Pending> = Vec::new();
    let mut seen_names: HashMap<String, ()> = HashMap::new();
    // `.` and `[i]` address a chain's stages and steps, and `.` an output: a name holding them
    // would read as another stage's.
    let check_name = |n: &str| -> Result<()> {
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(wiring(n, format!("`{n}` is not a stage or chain name: use letters, digits, `_` and `-`")));
        }
        Ok(())
    };
    let mut check_unique = |n: &str| -> Result<()> {
        check_name(n)?;
        if seen_names.insert(n.to_string(), ()).is_some() {
            return Err(wiring(n, "duplicate stage name".into()));
        }
        Ok(())
    };
    // `at` = (step, repeat) for a chain stage.
    let make_node = |su: &StageUse,
                     name: String,
                     base: String,
                     at: Option<(usize, usize)>,
                     loader: &mut KindLoader|
     -> Result<Node> {
        let step = at.map(|a| a.0);
        let kind = loader.load(file, &su.name, su.uses.as_deref().unwrap_or(&su.name))?;
        let mut params = Map::new();
        let mut sources = BTreeMap::new();
        for (k, v) in &kind.defaults {
            params.insert(k.clone(), v.clone());
            sources.insert(k.clone(), ParamSource::Default);
        }
        let defaults_toml = kind_defaults_toml(&kind);
        for (k, v) in &su.params {
            let Some(d) = defaults_toml.get(k) else {
                if su.kind_swapped {
                    tracing::warn!("stage `{name}`: param `{k}` of the pipeline file is not a param of the swapped-in kind `{}`; dropped", kind.name);
                    continue;
                }
                return Err(EngineError::Param {
                    path: file.to_path_buf(),
                    stage: name.clone(),
                    param: k.clone(),
                    message: format!(
                        "unknown param for stage kind `{}` (known: {})",
                        kind.name,
                        known_params(&kind)
                    ),
                });
            };
            let v = interpolate_step(v, at);
            let v = coerce(d, &v, None).map_err(|m| EngineError::Param {
                path: file.to_path_buf(),
                stage: name.clone(),
                param: k.clone(),
                message: m,
            })?;
            params.insert(k.clone(), toml_to_json(&v));
            sources.insert(k.clone(), ParamSource::Pipeline);
        }
        let resources = match &su.resources {
            Some(o) => kind.resources.overridden(o),
            None => kind.resources.clone(),
        };
        resources.time_limit().map_err(|m| EngineError::Param {
            path: file.to_path_buf(),
            stage: name.clone(),
            param: "resources.time".into(),
            message: m,
        })?;
        Ok(Node {
            name,
            base,
            stage: su.name.clone(),
            step,
            kind,
            params,
            param_sources: sources,
            inputs: BTreeMap::new(),
            resources,
        })
    };

    for su in &stages {
        check_unique(&su.name)?;
        let node = make_node(su, su.name.clone(), su.name.clone(), None, &mut loader)?;
        pending.push(Pending {
            node,
            raw_inputs: su.inputs.clone(),
            scope: None,
            carry: BTreeMap::new(),
        });
    }
    for c in &chains {
        check_unique(&c.name)?;
        let locals: Vec<String> = c.stage.iter().map(|s| s.name.clone()).collect();
        for (i, local) in locals.iter().enumerate() {
            check_name(local)?;
            if locals[..i].contains(local) {
                return Err(wiring(&format!("{}.{local}", c.name), "duplicate stage name in its chain".into()));
            }
        }
        // A carry that names no input of the chain's stages would be dropped, and every step
        // would read step 0's input.
        for key in c.carry.keys() {
            let bad = |m: String| wiring(&c.name, format!("carry `{key}`: {m}"));
            let (stage, input) = key.split_once('.').ok_or_else(|| bad("expected \"STAGE.INPUT\"".into()))?;
            let su = c.stage.iter().find(|su| su.name == stage).ok_or_else(|| {
                bad(format!("chain `{}` has no stage `{stage}` (its stages: {})", c.name, locals.join(", ")))
            })?;
            let kind = loader.load(file, &su.name, su.uses.as_deref().unwrap_or(&su.name))?;
            if !kind.inputs.contains_key(input) {
                return Err(bad(format!("stage kind `{}` has no input `{input}` (its inputs: {})", kind.name, kind.describe_inputs())));
            }
        }
        for i in 0..c.repeat {
            for su in &c.stage {
                let base = format!("{}.{}", c.name, su.name);
                let node = make_node(
                    su,
                    format!("{base}[{i}]"),
                    base,
                    Some((i, c.repeat)),
                    &mut loader,
                )?;
                let carry = c
                    .carry
                    .iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(&format!("{}.", su.name))
                            .map(|inp| (inp.to_string(), v.clone()))
                    })
                    .collect();
                pending.push(Pending {
                    node,
                    raw_inputs: su.inputs.clone(),
                    scope: Some((c.name.clone(), locals.clone(), i)),
                    carry,
                });
            }
        }
    }

    apply_sets(file, sets, &chains, &mut pending)?;

    // Every missing input file at once (a pipeline pointed at other data rewires several).
    let mut missing: Vec<String> = Vec::new();
    for p in &pending {
        for (input, raw) in &p.raw_inputs {
            if let Some(Err(why)) = file_ref(raw, &pdir) {
                let line = format!("stage `{}` input `{input}` = \"{raw}\": {why}", p.node.base);
                if !missing.contains(&line) {
                    missing.push(line);
                }
            }
        }
    }
    if missing.len() > 1 {
        return Err(EngineError::Parse {
            path: file.to_path_buf(),
            message: format!("{} input files do not exist:\n  {}", missing.len(), missing.join("\n  ")),
        });
    }

    // Wire inputs.
    let index: HashMap<String, usize> = pending
        .iter()
        .enumerate()
        .map(|(i, p)| (p.node.name.clone(), i))
        .collect();
    let repeats: HashMap<String, usize> =
        chains.iter().map(|c| (c.name.clone(), c.repeat)).collect();
    let mut wired: Vec<BTreeMap<String, InputRef>> = Vec::with_capacity(pending.len());
    for p in &pending {
        let n = &p.node;
        let mut inputs = BTreeMap::new();
        // Checks that upstream output `r` exists and fits `schema`.
        let check = |inp: &str, raw: &str, schema: SchemaInfo, r: &InputRef| -> Result<()> {
            let InputRef::Output { node, output } = r else {
                return Ok(());
            };
            let up = &pending[*node].node;
            let Some(up_schema) = up.kind.outputs.get(output) else {
                return Err(wiring(
                    &n.name,
                    format!(
                        "input `{inp}` = \"{raw}\": stage `{}` has no output `{output}` (its outputs: {})",
                        up.name,
                        up.kind.outputs.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            };
            if !schema.accepts(up_schema) {
                return Err(wiring(
                    &n.name,
                    format!("input `{inp}` expects schema `{schema}` but `{raw}` is `{up_schema}`"),
                ));
            }
            Ok(())
        };
        for (inp, schema) in &n.kind.inputs {
            let carried = p
                .scope
                .as_ref()
                .filter(|(_, _, i)| *i > 0)
                .and_then(|_| p.carry.get(inp));
            let (raw, step_shift) = match (carried, p.raw_inputs.get(inp)) {
                (Some(c), _) => (c, 1),
                (None, Some(r)) => (r, 0),
                (None, None) => {
                    return Err(wiring(
                        &n.name,
                        format!("input `{inp}` ({schema}) is not wired"),
                    ))
                }
            };
            let r = resolve_ref(raw, p, step_shift, &index, &repeats, &pdir)
                .map_err(|m| wiring(&n.name, format!("input `{inp}` = \"{raw}\": {m}")))?;
            check(inp, raw, *schema, &r)?;
            inputs.insert(inp.clone(), r);
        }
        for (inp, raw) in &p.raw_inputs {
            if n.kind.inputs.contains_key(inp) {
                continue;
            }
            let group = inp
                .split_once('.')
                .filter(|(_, label)| !label.is_empty())
                .and_then(|(g, _)| n.kind.input_groups.get(g));
            let Some(schema) = group else {
                return Err(wiring(
                    &n.name,
                    format!(
                        "stage kind `{}` has no input `{inp}` (its inputs: {})",
                        n.kind.name,
                        n.kind.describe_inputs()
                    ),
                ));
            };
            for (name, one) in expand_steps(inp, raw, &repeats)
                .map_err(|m| wiring(&n.name, format!("input `{inp}` = \"{raw}\": {m}")))?
            {
                let r = resolve_ref(&one, p, 0, &index, &repeats, &pdir)
                    .map_err(|m| wiring(&n.name, format!("input `{name}` = \"{one}\": {m}")))?;
                check(&name, &one, *schema, &r)?;
                inputs.insert(name, r);
            }
        }
        wired.push(inputs);
    }
    let mut nodes: Vec<Node> = pending.into_iter().map(|p| p.node).collect();
    for (n, inputs) in nodes.iter_mut().zip(wired) {
        n.inputs = inputs;
    }

    let mut graph = DiGraph::new();
    let ids: Vec<NodeIndex> = (0..nodes.len()).map(|i| graph.add_node(i)).collect();
    for (i, n) in nodes.iter().enumerate() {
        for r in n.inputs.values() {
            if let InputRef::Output { node, .. } = r {
                graph.update_edge(ids[*node], ids[i], ());
            }
        }
    }
    let order = match toposort(&graph, None) {
        Ok(o) => o.into_iter().map(|ix| graph[ix]).collect(),
        Err(_) => {
            return Err(EngineError::Cycle {
                path: file.to_path_buf(),
                cycle: describe_cycle(&graph, &nodes),
            })
        }
    };
    Ok(Plan {
        name,
        file: file.to_path_buf(),
        nodes,
        graph,
        order,
    })
}

fn kind_defaults_toml(kind: &StageKind) -> BTreeMap<String, toml::Value> {
    // Defaults were converted to JSON; convert back losslessly for type checks.
    kind.defaults
        .iter()
        .map(|(k, v)| (k.clone(), json_to_toml(v)))
        .collect()
}

fn json_to_toml(v: &Value) -> toml::Value {
    match v {
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Number(n) if n.is_i64() => toml::Value::Integer(n.as_i64().unwrap_or(0)),
        Value::Number(n) => toml::Value::Float(n.as_f64().unwrap_or(0.0)),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Array(a) => toml::Value::Array(a.iter().map(json_to_toml).collect()),
        Value::Object(o) => toml::Value::Table(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_toml(v)))
                .collect(),
        ),
        Value::Null => toml::Value::String(String::new()),
    }
}

fn known_params(kind: &StageKind) -> String {
    if kind.defaults.is_empty() {
        "none".into()
    } else {
        kind.defaults.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// In a chain stage's params `"{step}"` becomes the step number and `"{repeat}"` the chain length
/// (e.g. a learning-rate schedule's total steps); inside a longer string they are substituted.
fn interpolate_step(v: &toml::Value, at: Option<(usize, usize)>) -> toml::Value {
    let (toml::Value::String(s), Some((step, repeat))) = (v, at) else {
        return v.clone();
    };
    match s.as_str() {
        "{step}" => toml::Value::Integer(step as i64),
        "{repeat}" => toml::Value::Integer(repeat as i64),
        _ => toml::Value::String(
            s.replace("{step}", &step.to_string())
                .replace("{repeat}", &repeat.to_string()),
        ),
    }
}

/// The target of `--set '*.PARAM=…'` / `'*.inputs.NAME=…'`: every stage that has it.
pub const SET_EVERY_STAGE: &str = "*";

fn apply_sets(
    file: &Path,
    sets: &[SetArg],
    chains: &[ChainDef],
    pending: &mut [Pending],
) -> Result<()> {
    for s in sets {
        if (s.param == "repeat" && chains.iter().any(|c| c.name == s.target)) || s.param == "uses" {
            continue;
        }
        // `*` is every stage that has the input or param (one model for a whole pipeline).
        let every = s.target == SET_EVERY_STAGE;
        let mut matched = 0;
        for p in pending.iter_mut() {
            let n = &mut p.node;
            let named = n.name == s.target || n.base == s.target || n.stage == s.target;
            let has = match s.param.strip_prefix(INPUT_SET_PREFIX) {
                Some(input) => n.kind.inputs.contains_key(input),
                None => n.kind.defaults.contains_key(&s.param),
            };
            if !(named || (every && has)) {
                continue;
            }
            matched += 1;
            if let Some(input) = s.param.strip_prefix(INPUT_SET_PREFIX) {
                // Checked against the kind's inputs when wiring.
                p.raw_inputs.insert(input.to_string(), s.text.clone());
                continue;
            }
            let Some(d) = kind_defaults_toml(&n.kind).get(&s.param).cloned() else {
                return Err(EngineError::SetArg {
                    arg: s.raw.clone(),
                    message: format!(
                        "stage `{}` (kind `{}`) has no param `{}` (known: {})",
                        n.name,
                        n.kind.name,
                        s.param,
                        known_params(&n.kind)
                    ),
                });
            };
            let v = coerce(&d, &s.value, Some(&s.text)).map_err(|m| EngineError::SetArg {
                arg: s.raw.clone(),
                message: m,
            })?;
            n.params.insert(s.param.clone(), toml_to_json(&v));
            n.param_sources.insert(s.param.clone(), ParamSource::SetArg);
        }
        if matched == 0 && every {
            let what = match s.param.strip_prefix(INPUT_SET_PREFIX) {
                Some(input) => format!("an input `{input}`"),
                None => format!("a param `{}`", s.param),
            };
            return Err(EngineError::SetArg { arg: s.raw.clone(), message: format!("no stage of {} has {what}", file.display()) });
        }
        if matched == 0 {
            return Err(EngineError::SetArg {
                arg: s.raw.clone(),
                message: no_stage(&s.target, file, &name_list(pending.iter().map(|p| p.node.base.as_str()))),
            });
        }
    }
    Ok(())
}

/// A group member's ref `chain.stage[*].output` stands for every step: (`name[i]`, `chain.stage[i].output`)
/// for each i; any other ref is itself.
fn expand_steps(
    name: &str,
    raw: &str,
    repeats: &HashMap<String, usize>,
) -> std::result::Result<Vec<(String, String)>, String> {
    let Some((head, tail)) = raw.split_once("[*]") else {
        return Ok(vec![(name.to_string(), raw.to_string())]);
    };
    let chain = head.split('.').next().unwrap_or("");
    let n = *repeats
        .get(chain)
        .ok_or_else(|| format!("`[*]` needs a chain stage, and there is no chain `{chain}`"))?;
    if n == 0 {
        return Err(format!("chain `{chain}` has 0 steps"));
    }
    Ok((0..n)
        .map(|i| (format!("{name}[{i}]"), format!("{head}[{i}]{tail}")))
        .collect())
}

/// The path of a `file:` ref (relative to the pipeline's folder), or why it names none; `None`
/// for any other ref.
fn file_ref(raw: &str, pdir: &Path) -> Option<std::result::Result<PathBuf, String>> {
    let path = raw.strip_prefix("file:")?;
    if path.trim().is_empty() {
        return Some(Err("`file:` names no path".into()));
    }
    let full = pdir.join(path);
    Some(if full.exists() { Ok(full) } else { Err(format!("file `{}` does not exist", full.display())) })
}

/// Resolve `stage.output`, `chain.stage[i].output` (i may be negative or `last`), a sibling
/// `stage.output` inside a chain (same step, or the previous one for carried inputs), or `file:path`.
fn resolve_ref(
    raw: &str,
    p: &Pending,
    step_shift: usize,
    index: &HashMap<String, usize>,
    repeats: &HashMap<String, usize>,
    pdir: &Path,
) -> std::result::Result<InputRef, String> {
    if let Some(file) = file_ref(raw, pdir) {
        return file.map(|path| InputRef::File { path });
    }
    let (target, output) = raw
        .rsplit_once('.')
        .ok_or("expected `stage.output` or `file:path`")?;
    let instance = if let Some((chain_stage, idx)) =
        target.strip_suffix(']').and_then(|t| t.split_once('['))
    {
        let chain = chain_stage.split('.').next().unwrap_or("");
        let n = *repeats
            .get(chain)
            .ok_or_else(|| format!("no chain `{chain}`"))?;
        let i: i64 = if idx == "last" {
            -1
        } else {
            idx.parse().map_err(|_| format!("bad step index `{idx}`"))?
        };
        let i = if i < 0 { n as i64 + i } else { i };
        if i < 0 || i as usize >= n {
            return Err(format!(
                "step {idx} is out of range (chain `{chain}` has {n} steps)"
            ));
        }
        format!("{chain_stage}[{i}]")
    } else if let Some((chain, locals, step)) = &p.scope {
        if locals.iter().any(|l| l == target) {
            format!("{chain}.{target}[{}]", step - step_shift)
        } else {
            target.to_string()
        }
    } else if let Some(n) = target.split_once('.').and_then(|(c, _)| repeats.get(c)) {
        if *n == 0 {
            return Err(format!("chain of `{target}` has 0 steps"));
        }
        format!("{target}[{}]", n - 1)
    } else {
        target.to_string()
    };
    let node = *index
        .get(&instance)
        .ok_or_else(|| format!("no stage `{instance}`"))?;
    Ok(InputRef::Output {
        node,
        output: output.to_string(),
    })
}

/// Name one cycle of the graph as `a -> b -> a`.
fn describe_cycle(graph: &DiGraph<usize, ()>, nodes: &[Node]) -> String {
    for scc in tarjan_scc(graph) {
        let self_loop = scc.len() == 1 && graph.contains_edge(scc[0], scc[0]);
        if scc.len() < 2 && !self_loop {
            continue;
        }
        // Breadth-first search inside the SCC for the shortest way back to `start`.
        let start = scc[0];
        let mut prev: HashMap<NodeIndex, NodeIndex> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = start;
        'search: while let Some(cur) = queue.pop_front() {
            for next in graph.neighbors(cur).filter(|n| scc.contains(n)) {
                if next == start {
                    last = cur;
                    break 'search;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = prev.entry(next) {
                    e.insert(cur);
                    queue.push_back(next);
                }
            }
        }
        let mut path = vec![start];
        let mut cur = last;
        while cur != start {
            path.push(cur);
            cur = prev[&cur];
        }
        path.push(start);
        let last_ix = path.len() - 1;
        path[1..last_ix].reverse();
        return path
            .iter()
            .map(|ix| nodes[graph[*ix]].name.clone())
            .collect::<Vec<_>>()
            .join(" -> ");
    }
    "unknown".into()
}

impl Plan {
    /// Nodes whose instance name, base or stage name equals `target`.
    pub fn matching(&self, target: &str) -> Vec<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.name == target || n.base == target || n.stage == target)
            .map(|(i, _)| i)
            .collect()
    }

    /// The stages (`stage` or `chain.stage`) in the plan's order, as one line.
    pub fn stage_names(&self) -> String {
        name_list(self.nodes.iter().map(|n| n.base.as_str()))
    }

    /// `targets` plus all their ancestors.
    pub fn with_ancestors(&self, targets: &[usize]) -> Vec<bool> {
        let mut keep = vec![false; self.nodes.len()];
        let mut stack: Vec<usize> = targets.to_vec();
        while let Some(i) = stack.pop() {
            if keep[i] {
                continue;
            }
            keep[i] = true;
            for r in self.nodes[i].inputs.values() {
                if let InputRef::Output { node, .. } = r {
                    stack.push(*node);
                }
            }
        }
        keep
    }
}
