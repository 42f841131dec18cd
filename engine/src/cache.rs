//! Cache resolution: whether an instance's key is served from the store (committed by an earlier
//! run, or by another process while this one waited), and why not; and the pipeline's refs (the
//! key each instance had last, to explain what changed).

use std::collections::BTreeMap;

use super::error::Result;
use super::record::RunRecord;
use super::spec::{explain_change, short, InstanceSpec};
use super::store::{RefEntry, Store};

/// What the store holds for a key.
pub enum Lookup {
    /// Committed before this run.
    Cached(RunRecord),
    /// Committed by another process while this run waited for its lock.
    Reused(RunRecord),
    /// To be computed (absent, forced, or moved to quarantine as corrupt).
    Miss,
}

/// Look `spec` up in the store. A committed instance that fails its check is re-checked under
/// its lock and quarantined if still corrupt (not in a dry run, which changes nothing);
/// `line` reports waiting and quarantine.
pub fn lookup(store: &Store, spec: &InstanceSpec, forced: bool, dry_run: bool, line: &dyn Fn(&str)) -> Result<Lookup> {
    if forced {
        return Ok(Lookup::Miss);
    }
    match store.checked_record(&spec.key) {
        Ok(Some(rec)) => Ok(Lookup::Cached(rec)),
        Ok(None) => Ok(Lookup::Miss),
        Err(_) if dry_run => Ok(Lookup::Miss),
        Err(_) => {
            // Re-checked under the lock: another run may have replaced it by now.
            let name = &spec.instance;
            let on_wait = || line(&format!("waiting  {name} ({}): another process holds its lock", short(&spec.key)));
            match store.quarantine_if_corrupt(&spec.key, false, on_wait)? {
                Some((why, dest)) => {
                    line(&format!("corrupt  {name} ({}): {why}; moved to {} and recomputing", short(&spec.key), dest.display()));
                    Ok(Lookup::Miss)
                }
                None => Ok(store.checked_record(&spec.key).ok().flatten().map_or(Lookup::Miss, Lookup::Reused)),
            }
        }
    }
}

/// The pipeline's refs as read at the start of a run, updated as instances settle.
pub struct Refs {
    pub entries: BTreeMap<String, RefEntry>,
    dirty: bool,
}

impl Refs {
    pub fn read(store: &Store, pipeline: &str) -> Refs {
        Refs { entries: store.read_refs(pipeline), dirty: false }
    }

    /// Record that `spec.instance` now has `spec.key`.
    pub fn note(&mut self, spec: &InstanceSpec) {
        if self.entries.get(&spec.instance).map(|r| r.key != spec.key).unwrap_or(true) {
            self.entries.insert(spec.instance.clone(), RefEntry { key: spec.key.clone(), material: spec.key_material() });
            self.dirty = true;
        }
    }

    pub fn save(&self, store: &Store, pipeline: &str) -> Result<()> {
        if self.dirty {
            store.write_refs(pipeline, &self.entries)?;
        }
        Ok(())
    }
}

/// Why `spec` is not served from the store, compared with the last run of the same instance.
pub fn why_not_cached(store: &Store, refs: &BTreeMap<String, RefEntry>, spec: &InstanceSpec) -> Vec<String> {
    match refs.get(&spec.instance) {
        None => vec!["never run".into()],
        Some(r) if r.key == spec.key => {
            if store.instance_dir(&spec.key).exists() {
                vec!["stored output is incomplete or corrupt".into()]
            } else {
                vec!["output is not in the store (removed or never finished)".into()]
            }
        }
        Some(r) => {
            let why = explain_change(&r.material, &spec.key_material());
            if why.is_empty() {
                vec!["key changed".into()]
            } else {
                why
            }
        }
    }
}
