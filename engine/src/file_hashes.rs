//! Content hashes of large files, remembered by the file's identity, so a checkpoint of many GB
//! is read in full once, not by every `pipeline run` that names it with `file:` and again by
//! every stage that reads it (each `stage exec` checks its inputs before the stage runs). The
//! Table 2 step of issue 17 read its 3.5 GB checkpoint that way several times per stage.
//!
//! As Bazel's digest cache and git's index do, a remembered hash is trusted only while the file's
//! device, inode, size, mtime and ctime are all what they were when it was hashed. ctime cannot be
//! set from user space: rewriting a file and restoring its mtime (the corruption of issue 22's
//! test) still changes it. Entries live in the store's `hashes/`, one small JSON file per inode;
//! a lost or unreadable entry only costs a re-hash. `RREDCOT_REHASH=1` ignores them all.
//!
//! Files up to the store's re-hash limit are always hashed (cheap, and nothing to remember).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{EngineError, Result};
use super::hash::{manifest_hash, sha256_file};
use super::store::{list_files, REHASH_LIMIT};

/// A file's identity: while all of it is unchanged, so are its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Identity {
    fn of(path: &Path) -> Result<Identity> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(path).map_err(|e| EngineError::Io { path: path.to_path_buf(), error: e })?;
        Ok(Identity {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime_ns: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
            ctime_ns: md.ctime() * 1_000_000_000 + md.ctime_nsec(),
        })
    }

    /// Whether the file was last changed `margin` before `now`. A file written again within the
    /// clock tick of its recorded mtime and ctime would keep both, so a file changed just before
    /// it was hashed is not remembered (git's "racily clean" entries).
    fn settled(&self, now: SystemTime, margin: Duration) -> bool {
        let now_ns = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
        let newest = self.mtime_ns.max(self.ctime_ns) as i128;
        now_ns - newest >= margin.as_nanos() as i128
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    id: Identity,
    sha256: String,
    /// The absolute path it was hashed at (UTF-8 only), for [`FileHashes::prune`]: an entry
    /// whose path no longer has its identity can never be used again.
    #[serde(default)]
    path: Option<String>,
}

/// What [`FileHashes::prune`] did (or would do).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub kept: usize,
    pub removed: usize,
}

/// How long before hashing a file must have been left alone for its hash to be remembered.
const SETTLED: Duration = Duration::from_secs(2);

/// Most files hashed at once (each is one sequential read).
const MAX_THREADS: usize = 8;

/// Where hashes are remembered, and whether they may be.
#[derive(Debug, Clone)]
pub struct FileHashes {
    /// `STORE/hashes`; None: hash everything, remember nothing.
    dir: Option<PathBuf>,
    /// Entries may be written (false for read-only commands).
    write: bool,
    /// Remembered hashes are used (false with `RREDCOT_REHASH=1`).
    trust: bool,
    /// [`SETTLED`], shorter in tests.
    settled: Duration,
}

impl FileHashes {
    /// Hashes remembered in the store at `store_root` (`write`: new ones are added; a store
    /// that does not exist yet is never created).
    pub fn in_store(store_root: &Path, write: bool) -> FileHashes {
        let dir = store_root.join("hashes");
        let write = write && dir.is_dir();
        FileHashes { dir: Some(dir), write, trust: !rehash_requested(), settled: SETTLED }
    }

    /// Every file hashed, nothing remembered (`artifact verify`).
    pub fn none() -> FileHashes {
        FileHashes { dir: None, write: false, trust: false, settled: SETTLED }
    }

    /// Content hash of a file or directory as an artifact ([`manifest_hash`] of its files
    /// relative to `path`; a single file is the one entry ""), its files hashed in parallel.
    pub fn source(&self, path: &Path) -> Result<String> {
        let (names, files): (Vec<String>, Vec<PathBuf>) = if path.is_dir() {
            list_files(path)?.into_iter().map(|rel| (rel.to_string_lossy().to_string(), path.join(rel))).unzip()
        } else {
            (vec![String::new()], vec![path.to_path_buf()])
        };
        let shas = self.files(&files)?;
        Ok(manifest_hash(&names.into_iter().zip(shas).collect::<Vec<_>>()))
    }

    /// sha256 of each file, in order: remembered ones looked up, the others read (several at a
    /// time) and remembered.
    pub fn files(&self, paths: &[PathBuf]) -> Result<Vec<String>> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS).min(paths.len());
        if threads <= 1 {
            return paths.iter().map(|p| self.file(p)).collect();
        }
        let next = AtomicUsize::new(0);
        let done: Vec<(usize, Result<String>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(p) = paths.get(i) else { break mine };
                            mine.push((i, self.file(p)));
                        }
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().expect("a hashing thread panicked")).collect()
        });
        let mut out: Vec<Option<Result<String>>> = (0..paths.len()).map(|_| None).collect();
        for (i, r) in done {
            out[i] = Some(r);
        }
        out.into_iter().map(|r| r.expect("every file hashed")).collect()
    }

    /// sha256 of one file.
    pub fn file(&self, path: &Path) -> Result<String> {
        let before = Identity::of(path)?;
        if before.size <= REHASH_LIMIT {
            return sha256_file(path);
        }
        if self.trust {
            if let Some(e) = self.entry(&before) {
                return Ok(e.sha256);
            }
        }
        let started = SystemTime::now();
        let sha = sha256_file(path)?;
        // Remembered only if nothing changed while it was read and it had settled before.
        if Identity::of(path).is_ok_and(|after| after == before) && before.settled(started, self.settled) {
            self.put(path, &before, &sha);
        }
        Ok(sha)
    }

    /// Remembers `sha256` for a file this process has just finished writing and hashed itself
    /// (a committed output: no writer is left that could change it within the clock tick).
    pub fn written(&self, path: &Path, sha256: &str) {
        if let Ok(id) = Identity::of(path) {
            if id.size > REHASH_LIMIT {
                self.put(path, &id, sha256);
            }
        }
    }

    /// Removes (with `dry_run`, only counts) the remembered hashes that can never be used
    /// again: their file is gone or changed (a deleted instance, a rewritten checkpoint), or the
    /// entry is unreadable or from before entries named their file. The store's `hashes/`
    /// otherwise keeps one entry per large file ever hashed (`artifact gc` calls this).
    pub fn prune(store_root: &Path, dry_run: bool) -> Result<Pruned> {
        let dir = store_root.join("hashes");
        let mut done = Pruned::default();
        let listing = match std::fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
            Err(e) => return Err(EngineError::Io { path: dir, error: e }),
        };
        for item in listing {
            let item = item.map_err(|e| EngineError::Io { path: dir.clone(), error: e })?;
            let path = item.path();
            // Temporary files of writers are `Store::clean_stale`'s.
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let live = std::fs::read(&path)
                .ok()
                .and_then(|text| serde_json::from_slice::<Entry>(&text).ok())
                .and_then(|e| Some(Identity::of(Path::new(&e.path?)).ok()? == e.id))
                .unwrap_or(false);
            if live {
                done.kept += 1;
                continue;
            }
            if !dry_run {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(EngineError::Io { path, error: e }),
                }
            }
            done.removed += 1;
        }
        Ok(done)
    }

    fn entry_path(&self, id: &Identity) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{}-{}.json", id.dev, id.ino)))
    }

    fn entry(&self, id: &Identity) -> Option<Entry> {
        let text = std::fs::read(self.entry_path(id)?).ok()?;
        let e: Entry = serde_json::from_slice(&text).ok()?;
        (e.id == *id && e.sha256.len() == 64).then_some(e)
    }

    /// Best effort: an entry that cannot be written is a re-hash next time, never an error.
    fn put(&self, file: &Path, id: &Identity, sha256: &str) {
        if !self.write {
            return;
        }
        let Some(path) = self.entry_path(id) else { return };
        let file = std::path::absolute(file).ok().and_then(|p| p.to_str().map(str::to_string));
        let entry = Entry { id: *id, sha256: sha256.to_string(), path: file };
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        // `NAME.SEQ.tmp.PID`, the form `Store::clean_stale` removes once its writer is gone.
        let tmp = path.with_extension(format!("{}.tmp.{}", SEQ.fetch_add(1, Ordering::Relaxed), std::process::id()));
        let text = serde_json::to_vec(&entry).expect("an entry serializes");
        if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// `RREDCOT_REHASH=1`: hash every file in full, as if nothing were remembered.
fn rehash_requested() -> bool {
    std::env::var("RREDCOT_REHASH").is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = REHASH_LIMIT as usize + 1000;

    fn store() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for sub in ["instances", "hashes"] {
            std::fs::create_dir_all(d.path().join(sub)).unwrap();
        }
        d
    }

    fn big_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![byte; BIG]).unwrap();
        p
    }

    /// Remembers at once (no settling time), as a file hashed long after it was written is.
    fn settled(h: FileHashes) -> FileHashes {
        FileHashes { settled: Duration::ZERO, ..h }
    }

    fn entries(store: &Path) -> usize {
        std::fs::read_dir(store.join("hashes")).unwrap().count()
    }

    #[test]
    fn a_remembered_hash_is_used_while_the_file_keeps_its_identity() {
        let s = store();
        let f = big_file(s.path(), "ckpt.bin", 7);
        let h = settled(FileHashes::in_store(s.path(), true));
        let real = h.file(&f).unwrap();
        assert_eq!(real, sha256_file(&f).unwrap());
        assert_eq!(entries(s.path()), 1);
        // A planted hash for the same identity is what comes back: the file was not read.
        let id = Identity::of(&f).unwrap();
        let fake = "f".repeat(64);
        h.put(&f, &id, &fake);
        assert_eq!(h.file(&f).unwrap(), fake);
        // None, and a hash set that does not trust remembered ones, read the file.
        assert_eq!(FileHashes::none().file(&f).unwrap(), real);
        assert_eq!(FileHashes { trust: false, ..h.clone() }.file(&f).unwrap(), real);
    }

    #[test]
    fn a_rewrite_that_keeps_size_and_mtime_is_hashed_again() {
        let s = store();
        let f = big_file(s.path(), "ckpt.bin", 7);
        let h = settled(FileHashes::in_store(s.path(), true));
        let before = h.file(&f).unwrap();
        let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
        // Past the kernel's timestamp tick, as any rewrite of a file remembered in use is (it
        // had settled for SETTLED before it was remembered).
        std::thread::sleep(Duration::from_millis(50));
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[BIG / 2] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        std::fs::File::options().write(true).open(&f).unwrap().set_modified(mtime).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), mtime);
        let after = h.file(&f).unwrap();
        assert_ne!(after, before);
        assert_eq!(after, sha256_file(&f).unwrap());
    }

    #[test]
    fn a_file_changed_just_before_it_was_hashed_is_not_remembered() {
        let s = store();
        let f = big_file(s.path(), "fresh.bin", 1);
        let h = FileHashes::in_store(s.path(), true);
        assert_eq!(h.file(&f).unwrap(), sha256_file(&f).unwrap());
        assert_eq!(entries(s.path()), 0, "written within {SETTLED:?} of its hashing");
        // A committed output is remembered at once: its writer has finished.
        h.written(&f, &sha256_file(&f).unwrap());
        assert_eq!(entries(s.path()), 1);
    }

    #[test]
    fn read_only_hash_sets_and_small_files_write_no_entries() {
        let s = store();
        let f = big_file(s.path(), "ckpt.bin", 3);
        let small = s.path().join("small.txt");
        std::fs::write(&small, "tiny").unwrap();
        settled(FileHashes::in_store(s.path(), false)).file(&f).unwrap();
        settled(FileHashes::none()).file(&f).unwrap();
        settled(FileHashes::in_store(s.path(), true)).file(&small).unwrap();
        assert_eq!(entries(s.path()), 0);
        // A store without `hashes/` (an older one, or none yet) gets none either.
        let bare = tempfile::tempdir().unwrap();
        settled(FileHashes::in_store(bare.path(), true)).file(&f).unwrap();
        assert!(!bare.path().join("hashes").exists());
    }

    #[test]
    fn a_directory_hashes_as_before_with_its_files_in_parallel() {
        let s = store();
        let dir = s.path().join("model");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for (i, name) in ["a.bin", "b.bin", "sub/c.bin", "d.bin"].iter().enumerate() {
            big_file(&dir, name, i as u8);
        }
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let pairs: Vec<(String, String)> = list_files(&dir)
            .unwrap()
            .into_iter()
            .map(|rel| (rel.to_string_lossy().to_string(), sha256_file(&dir.join(&rel)).unwrap()))
            .collect();
        let expected = manifest_hash(&pairs);
        let h = settled(FileHashes::in_store(s.path(), true));
        assert_eq!(h.source(&dir).unwrap(), expected);
        assert_eq!(entries(s.path()), 4);
        assert_eq!(h.source(&dir).unwrap(), expected, "from remembered hashes");
        let file = dir.join("a.bin");
        assert_eq!(h.source(&file).unwrap(), manifest_hash(&[(String::new(), sha256_file(&file).unwrap())]));
    }

    #[test]
    fn prune_removes_the_entries_of_files_gone_or_changed_and_keeps_the_rest() {
        let s = store();
        let h = settled(FileHashes::in_store(s.path(), true));
        let kept = big_file(s.path(), "kept.bin", 1);
        let gone = big_file(s.path(), "gone.bin", 2);
        let changed = big_file(s.path(), "changed.bin", 3);
        for f in [&kept, &gone, &changed] {
            h.file(f).unwrap();
        }
        // An entry from before entries named their file, and one that is not JSON.
        let old = serde_json::json!({"id": Identity::of(&kept).unwrap(), "sha256": "a".repeat(64)});
        std::fs::write(s.path().join("hashes/1-2.json"), old.to_string()).unwrap();
        std::fs::write(s.path().join("hashes/3-4.json"), "{").unwrap();
        // A writer's temporary file is not an entry.
        std::fs::write(s.path().join("hashes/5-6.0.tmp.1"), "{").unwrap();
        std::fs::remove_file(&gone).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&changed, vec![4u8; BIG]).unwrap();
        assert_eq!(entries(s.path()), 6);

        let would = FileHashes::prune(s.path(), true).unwrap();
        assert_eq!(would, Pruned { kept: 1, removed: 4 });
        assert_eq!(entries(s.path()), 6, "a dry run removes nothing");
        assert_eq!(FileHashes::prune(s.path(), false).unwrap(), would);
        assert_eq!(entries(s.path()), 2);
        assert!(s.path().join("hashes/5-6.0.tmp.1").exists());
        // The kept entry is still the one used.
        let id = Identity::of(&kept).unwrap();
        assert_eq!(h.entry(&id).unwrap().sha256, sha256_file(&kept).unwrap());
        // A store without hashes/ has nothing to prune.
        assert_eq!(FileHashes::prune(tempfile::tempdir().unwrap().path(), false).unwrap(), Pruned::default());
    }
}
