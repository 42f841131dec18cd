//! The content-addressed store.
//!
//! ```text
//! <store>/instances/<key>/run.json      commit point (written last, then the directory is renamed in)
//! <store>/instances/<key>/outputs/...   the artifacts (immutable once committed)
//! <store>/tmp/<key>.<pid>/              work in progress; never read
//! <store>/locks/<key>.lock              one writer per instance (OS file lock)
//! <store>/specs/<key>.json              what `stage exec KEY` runs
//! <store>/logs/<key>.log                stage output
//! <store>/refs/<pipeline>.json          last key of each instance (to explain staleness)
//! <store>/quarantine/                   corrupt or superseded instances, moved aside, never deleted
//! <store>/cache/<stage kind>/            stage state kept across runs (e.g. judge replies), not artifacts
//! ```
//!
//! Writers (`pipeline run`, `stage exec`) open it with [`Store::open`], which creates it;
//! read-only commands use [`Store::existing`], which never writes.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{EngineError, IoContext, Result};
use super::file_hashes::FileHashes;
use super::hash::{manifest_hash, sha256_file};
use super::record::{FileRecord, OutputRecord, RunRecord};
use super::spec::InstanceSpec;

/// Files up to this size are re-hashed on every cache hit; larger ones are checked by size+mtime.
pub(crate) const REHASH_LIMIT: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct Store {
    pub root: PathBuf,
}

/// An exclusive OS lock on one instance; released on drop (and by the kernel if we die).
pub struct InstanceLock {
    _file: File,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RefEntry {
    pub key: String,
    pub material: Value,
}

impl Store {
    pub fn open(root: &Path) -> Result<Store> {
        for sub in [
            "instances",
            "tmp",
            "locks",
            "specs",
            "logs",
            "refs",
            "quarantine",
            "hashes",
        ] {
            fs::create_dir_all(root.join(sub)).at(root.join(sub))?;
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// Open without creating anything (read-only commands).
    pub fn existing(root: &Path) -> Result<Store> {
        if !root.join("instances").is_dir() {
            return Err(EngineError::NoStore {
                path: root.to_path_buf(),
            });
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    /// A store that may not exist yet, for reads only (a dry run on a new store): every
    /// instance reads as absent and nothing is created.
    pub fn unopened(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    pub fn instance_dir(&self, key: &str) -> PathBuf {
        self.root.join("instances").join(key)
    }

    pub fn outputs_dir(&self, key: &str) -> PathBuf {
        self.instance_dir(key).join("outputs")
    }

    pub fn spec_path(&self, key: &str) -> PathBuf {
        self.root.join("specs").join(format!("{key}.json"))
    }

    /// Where stages keep state across runs (`StageContext::cache_dir`); created by the stage.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    pub fn log_path(&self, key: &str) -> PathBuf {
        self.root.join("logs").join(format!("{key}.log"))
    }

    /// The run record of a committed instance, or None when incomplete/absent.
    pub fn record(&self, key: &str) -> Option<RunRecord> {
        self.read_record(key).ok().flatten()
    }

    /// Ok(None): no instance directory; Err(why): a directory whose `run.json` is missing,
    /// unreadable or not a run record of this key (a corrupt instance, never a finished one).
    pub fn read_record(&self, key: &str) -> std::result::Result<Option<RunRecord>, String> {
        let dir = self.instance_dir(key);
        let path = dir.join("run.json");
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(_) if !dir.exists() => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let rec: RunRecord = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: not a valid run record ({e})", path.display()))?;
        if rec.key != key {
            return Err(format!(
                "{}: records key {} instead",
                path.display(),
                rec.key
            ));
        }
        Ok(Some(rec))
    }

    /// A committed instance that passes the quick check; Err(why) for a corrupt one.
    pub fn checked_record(&self, key: &str) -> std::result::Result<Option<RunRecord>, String> {
        match self.read_record(key)? {
            Some(rec) => self.quick_check(&rec).map(|()| Some(rec)),
            None => Ok(None),
        }
    }

    /// Cheap integrity check used on every cache hit: sizes, small files re-hashed, large by mtime.
    pub fn quick_check(&self, rec: &RunRecord) -> std::result::Result<(), String> {
        self.check_files(rec, false)
    }

    /// Full re-hash of every output file.
    pub fn verify(&self, rec: &RunRecord) -> std::result::Result<(), String> {
        self.check_files(rec, true)
    }

    /// Moves a corrupt instance aside under its lock, after checking again that it is still
    /// corrupt: another process may have replaced it with a good one while we waited for the
    /// lock (`on_wait` is called before waiting). `full`: re-hash every file, not only the
    /// quick check. Ok(None): it is not corrupt (any more).
    pub fn quarantine_if_corrupt(
        &self,
        key: &str,
        full: bool,
        on_wait: impl FnOnce(),
    ) -> Result<Option<(String, PathBuf)>> {
        let _lock = match self.try_lock(key)? {
            Some(l) => l,
            None => {
                on_wait();
                self.lock(key)?
            }
        };
        let check = match self.read_record(key) {
            Ok(Some(rec)) if full => self.verify(&rec),
            Ok(Some(rec)) => self.quick_check(&rec),
            Ok(None) => Ok(()),
            Err(why) => Err(why),
        };
        match check {
            Ok(()) => Ok(None),
            Err(why) => Ok(Some((
                why.clone(),
                self.quarantine(key, &format!("corrupt: {why}"))?,
            ))),
        }
    }

    fn check_files(&self, rec: &RunRecord, full: bool) -> std::result::Result<(), String> {
        let out = self.outputs_dir(&rec.key);
        for (name, o) in &rec.outputs {
            for f in &o.files {
                let p = out.join(&f.path);
                let md = fs::metadata(&p)
                    .map_err(|e| format!("output `{name}`: {}: {e}", p.display()))?;
                if md.len() != f.bytes {
                    return Err(format!(
                        "output `{name}`: {} has {} bytes, recorded {}",
                        p.display(),
                        md.len(),
                        f.bytes
                    ));
                }
                if full || f.bytes <= REHASH_LIMIT {
                    let h = sha256_file(&p).map_err(|e| e.to_string())?;
                    if h != f.sha256 {
                        return Err(format!(
                            "output `{name}`: {} content hash changed",
                            p.display()
                        ));
                    }
                } else if mtime_ns(&md) != f.mtime_ns {
                    let h = sha256_file(&p).map_err(|e| e.to_string())?;
                    if h != f.sha256 {
                        return Err(format!(
                            "output `{name}`: {} content hash changed",
                            p.display()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Move an instance aside (corrupt or superseded); nothing is deleted.
    pub fn quarantine(&self, key: &str, why: &str) -> Result<PathBuf> {
        let stamp = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dest = self.root.join("quarantine").join(format!("{key}.{stamp}"));
        fs::rename(self.instance_dir(key), &dest).at(&dest)?;
        fs::write(dest.join("QUARANTINED"), format!("{why}\n")).at(&dest)?;
        Ok(dest)
    }

    /// Held shared by every process that runs instances on this store (`pipeline run`, `stage
    /// exec`) while it runs, and exclusively by `artifact gc`, so gc never removes an instance a
    /// run is about to read (readers take no instance lock).
    pub fn in_use(&self) -> Result<InstanceLock> {
        let path = self.use_lock_path();
        let file = File::create(&path).at(&path)?;
        file.lock_shared().at(&path)?;
        Ok(InstanceLock { _file: file })
    }

    /// The store to itself (`artifact gc`), or `None` while a run holds [`Store::in_use`].
    pub fn try_alone(&self) -> Result<Option<InstanceLock>> {
        try_lock_file(self.use_lock_path())
    }

    fn use_lock_path(&self) -> PathBuf {
        // Not a key: instance locks are named by 64 hex digits.
        self.root.join("locks").join("store-in-use.lock")
    }

    pub fn lock(&self, key: &str) -> Result<InstanceLock> {
        let path = self.root.join("locks").join(format!("{key}.lock"));
        let file = File::create(&path).at(&path)?;
        file.lock().at(&path)?;
        Ok(InstanceLock { _file: file })
    }

    /// Some(lock) when free, None when another process holds it.
    pub fn try_lock(&self, key: &str) -> Result<Option<InstanceLock>> {
        try_lock_file(self.root.join("locks").join(format!("{key}.lock")))
    }

    /// A fresh temp dir for `key`; leftovers of dead runs are removed (caller holds the lock).
    pub fn fresh_tmp(&self, key: &str) -> Result<PathBuf> {
        self.remove_tmp_of(key);
        let dir = self.root.join("tmp").join(format!("{key}.{}", std::process::id()));
        fs::create_dir_all(dir.join("outputs")).at(&dir)?;
        Ok(dir)
    }

    /// Removes the temp dirs of `key` (what a killed stage process wrote); the caller holds its
    /// lock, so none of them is being written.
    pub fn remove_tmp_of(&self, key: &str) {
        if let Ok(entries) = fs::read_dir(self.root.join("tmp")) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(key) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// Commit: run.json written last into the temp dir, everything fsynced, then renamed into place.
    pub fn commit(&self, tmp: &Path, rec: &RunRecord) -> Result<()> {
        let text = serde_json::to_vec_pretty(rec).expect("record serializes");
        let rj = tmp.join("run.json");
        let mut f = File::create(&rj).at(&rj)?;
        f.write_all(&text).at(&rj)?;
        f.sync_all().at(&rj)?;
        fsync_tree(tmp)?;
        let dest = self.instance_dir(&rec.key);
        if dest.exists() {
            // Only reachable with --force (a corrupt instance is moved aside before the run).
            self.quarantine(&rec.key, "superseded by a forced rerun")?;
        }
        fs::rename(tmp, &dest).at(&dest)?;
        sync_dir(&self.root.join("instances"))?;
        Ok(())
    }

    pub fn write_spec(&self, spec: &InstanceSpec) -> Result<()> {
        atomic_write(
            &self.spec_path(&spec.key),
            &serde_json::to_vec_pretty(spec).expect("spec serializes"),
        )
    }

    /// The planned instance whose key is `key` or the one that starts with it (the short keys
    /// `pipeline run` prints); a prefix no spec has is returned as it is, for [`Self::read_spec`]
    /// to say that nothing is planned under it.
    pub fn planned_key(&self, key: &str) -> Result<String> {
        let dir = self.root.join("specs");
        // A key names files in the store: nothing but its hex digits may reach a path.
        if !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(EngineError::Store { path: dir, message: format!("`{key}` is not an instance key (hex digits, as `pipeline run` prints them)") });
        }
        if key.is_empty() || self.spec_path(key).is_file() {
            return Ok(key.to_string());
        }
        let found: Vec<String> = fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_string))
            .filter(|k| k.starts_with(key))
            .collect();
        match found.as_slice() {
            [k] => Ok(k.clone()),
            [] => Ok(key.to_string()),
            many => Err(EngineError::Store {
                path: dir,
                message: format!("key prefix `{key}` is ambiguous ({} planned instances)", many.len()),
            }),
        }
    }

    pub fn read_spec(&self, key: &str) -> Result<InstanceSpec> {
        let p = self.spec_path(key);
        let text = fs::read(&p).map_err(|e| EngineError::Store {
            path: p.clone(),
            message: format!(
                "no spec for instance {key} ({e}); run `rredcot pipeline run` to plan it"
            ),
        })?;
        serde_json::from_slice(&text).map_err(|e| EngineError::Parse {
            path: p,
            message: e.to_string(),
        })
    }

    pub fn read_refs(&self, pipeline: &str) -> BTreeMap<String, RefEntry> {
        fs::read(self.refs_path(pipeline))
            .ok()
            .and_then(|t| serde_json::from_slice(&t).ok())
            .unwrap_or_default()
    }

    pub fn write_refs(&self, pipeline: &str, refs: &BTreeMap<String, RefEntry>) -> Result<()> {
        atomic_write(
            &self.refs_path(pipeline),
            &serde_json::to_vec(refs).expect("refs serialize"),
        )
    }

    fn refs_path(&self, pipeline: &str) -> PathBuf {
        self.root.join("refs").join(format!("{pipeline}.json"))
    }

    /// Removes what interrupted writers left: `tmp/<key>.<pid>/` work directories whose instance
    /// lock is free, and `*.tmp.<pid>` files of atomic writes in `specs/`, `refs/` and `hashes/` whose writer
    /// is gone. A pid is only known on the host that wrote the file, so such a file must also be
    /// older than a minute (another host's write in progress is younger). Returns what it removed.
    pub fn clean_stale(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        if let Ok(entries) = fs::read_dir(self.root.join("tmp")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let Some((key, _pid)) = name.rsplit_once('.') else {
                    continue;
                };
                // A free lock means no writer: they hold it for as long as their tmp dir exists.
                if let Ok(Some(_lock)) = self.try_lock(key) {
                    if fs::remove_dir_all(e.path()).is_ok() {
                        removed.push(e.path());
                    }
                }
            }
        }
        for sub in ["specs", "refs", "hashes"] {
            let Ok(entries) = fs::read_dir(self.root.join(sub)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let Some(pid) = name
                    .rsplit_once(".tmp.")
                    .and_then(|(_, p)| p.parse::<libc::pid_t>().ok())
                else {
                    continue;
                };
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().map(|a| a > STALE_AFTER).unwrap_or(false))
                    .unwrap_or(false);
                if old && !pid_alive(pid) && fs::remove_file(e.path()).is_ok() {
                    removed.push(e.path());
                }
            }
        }
        removed
    }

    /// Keys of every committed instance directory.
    pub fn instance_keys(&self) -> Result<Vec<String>> {
        let dir = self.root.join("instances");
        let mut keys: Vec<String> = fs::read_dir(&dir)
            .at(&dir)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        keys.sort();
        Ok(keys)
    }
}

/// How old an atomic-write temp file must be before a dead pid makes it stale.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a process with this pid runs on this host.
fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

fn mtime_ns(md: &fs::Metadata) -> i128 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// All regular files under `root` as sorted relative paths.
pub(crate) fn list_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).at(&d)? {
            let e = e.at(&d)?;
            let ft = e.file_type().at(e.path())?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(
                    e.path()
                        .strip_prefix(root)
                        .expect("under root")
                        .to_path_buf(),
                );
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Hash one output (a file or a directory) found at `path` inside `outputs_dir`.
/// The artifact hash covers paths relative to the artifact itself (as `hash_source` does), so an
/// output and an identical source file hash equal.
pub fn hash_output(outputs_dir: &Path, path: &Path, schema: &str) -> Result<OutputRecord> {
    let rel_base = path.strip_prefix(outputs_dir).unwrap_or(path).to_path_buf();
    let inner: Vec<Option<PathBuf>> = if path.is_dir() {
        list_files(path)?.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    let rels: Vec<PathBuf> = inner.iter().map(|w| w.as_ref().map_or_else(|| rel_base.clone(), |w| rel_base.join(w))).collect();
    let fulls: Vec<PathBuf> = rels.iter().map(|r| outputs_dir.join(r)).collect();
    // Nothing is remembered for files in a temp dir; the commit remembers them in place.
    let shas = FileHashes::none().files(&fulls)?;
    let mut files = Vec::new();
    let mut pairs = Vec::new();
    for (((within, rel), full), sha) in inner.into_iter().zip(rels).zip(&fulls).zip(shas) {
        let md = fs::metadata(full).at(full)?;
        pairs.push((
            within
                .map(|w| w.to_string_lossy().to_string())
                .unwrap_or_default(),
            sha.clone(),
        ));
        files.push(FileRecord {
            path: rel.to_string_lossy().to_string(),
            bytes: md.len(),
            sha256: sha,
            mtime_ns: mtime_ns(&md),
        });
    }
    Ok(OutputRecord {
        schema: schema.to_string(),
        hash: manifest_hash(&pairs),
        files,
    })
}

/// Content hash of a source file or directory named by a `file:` input, every file read in
/// full (`FileHashes::source` uses remembered hashes).
pub fn hash_source(path: &Path) -> Result<String> {
    FileHashes::none().source(path)
}

/// An exclusive lock on the file at `path` (created if missing), or `None` when another process
/// holds it.
fn try_lock_file(path: PathBuf) -> Result<Option<InstanceLock>> {
    let file = File::create(&path).at(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(InstanceLock { _file: file })),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(EngineError::Io { path, error: e }),
    }
}

pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .at(&tmp)
        .and_then(|()| fs::rename(&tmp, path).at(path));
    if written.is_err() {
        // Not left for the next run's cleanup: a full disk is the usual cause.
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

fn fsync_tree(root: &Path) -> Result<()> {
    for rel in list_files(root)? {
        let p = root.join(rel);
        File::open(&p).and_then(|f| f.sync_all()).at(&p)?;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        sync_dir(&d)?;
        for e in fs::read_dir(&d).at(&d)?.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails leaves no temp file behind (a full disk left `*.tmp.PID` files until a
    /// later run cleaned them).
    #[test]
    fn a_failed_atomic_write_removes_its_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory where the file should go: the rename onto it fails.
        let target = dir.path().join("refs.json");
        fs::create_dir_all(target.join("inside")).unwrap();
        assert!(atomic_write(&target, b"{}").is_err());
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("refs.json")], "only the directory that was there");
        let ok = dir.path().join("ok.json");
        atomic_write(&ok, b"{}").unwrap();
        assert_eq!(fs::read(&ok).unwrap(), b"{}");
    }
}
