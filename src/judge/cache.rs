//! The HTTP judge's response cache: one JSON file per request, `<dir>/<sha256>.json`, named by the
//! sha256 of the canonical request (endpoint path, model, messages, sampling params, seed; never
//! the host or the API key).
//!
//! The stage puts it under `<store>/cache/judge/`, outside any instance directory, so the replies a
//! failed or interrupted run did get are reused by the next run, and a rerun of a finished one
//! sends nothing. Entries are written to a temp file and renamed into place; an entry that does not
//! parse, belongs to another request or holds no reply is dropped (deleted) and asked again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::{reply_content, JudgeError};
use crate::engine::hash::{canonical_json, sha256_json};

pub struct ResponseCache {
    dir: PathBuf,
}

/// What the cache holds for a request.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// The reply text of the cached response.
    Hit(String),
    Miss,
    /// An unusable entry (removed); the reason.
    Corrupt(String),
}

impl ResponseCache {
    pub fn open(dir: &Path) -> Result<ResponseCache, JudgeError> {
        std::fs::create_dir_all(dir).map_err(|e| JudgeError::Cache { path: dir.to_path_buf(), message: e.to_string() })?;
        Ok(ResponseCache { dir: dir.to_path_buf() })
    }

    /// The cache key of a request: sha256 of its canonical JSON.
    pub fn key(request: &Value) -> String {
        sha256_json(request)
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    pub fn get(&self, key: &str, request: &Value) -> Lookup {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt(format!("{}: {e}", path.display())),
        };
        let why = match serde_json::from_slice::<Value>(&bytes) {
            Err(e) => format!("not JSON ({e})"),
            Ok(entry) if canonical_json(&entry["request"]) != canonical_json(request) => "holds another request".to_string(),
            Ok(entry) => match reply_content(&entry["response"]) {
                Some(text) => return Lookup::Hit(text),
                None => "no reply in the cached response".to_string(),
            },
        };
        let _ = std::fs::remove_file(&path);
        Lookup::Corrupt(format!("{}: {why}", path.display()))
    }

    /// Stores a response atomically (temp file + rename; concurrent writers of one key are fine).
    pub fn put(&self, key: &str, request: &Value, response: &Value) -> Result<(), JudgeError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = self.path(key);
        let tmp = self.dir.join(format!(".{key}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let err = |e: std::io::Error| JudgeError::Cache { path: path.clone(), message: e.to_string() };
        let body = serde_json::to_vec_pretty(&json!({ "request": request, "response": response })).expect("JSON values serialize");
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&body).and_then(|_| f.sync_all()).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(text: &str) -> Value {
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
    }

    #[test]
    fn keys_are_canonical_and_cover_every_field() {
        let a = json!({"path": "/v1/chat/completions", "body": {"model": "m", "seed": 1, "messages": [{"role": "user", "content": "x"}]}});
        let b = json!({"body": {"messages": [{"content": "x", "role": "user"}], "seed": 1, "model": "m"}, "path": "/v1/chat/completions"});
        assert_eq!(ResponseCache::key(&a), ResponseCache::key(&b));
        let mut c = a.clone();
        c["body"]["seed"] = json!(2);
        assert_ne!(ResponseCache::key(&a), ResponseCache::key(&c));
        let mut d = a.clone();
        d["body"]["messages"][0]["content"] = json!("y");
        assert_ne!(ResponseCache::key(&a), ResponseCache::key(&d));
    }

    #[test]
    fn put_get_and_corrupt_entries_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResponseCache::open(&dir.path().join("judge")).unwrap();
        let req = json!({"body": {"model": "m"}});
        let key = ResponseCache::key(&req);
        assert_eq!(cache.get(&key, &req), Lookup::Miss);
        cache.put(&key, &req, &response("Verdict: YES")).unwrap();
        assert_eq!(cache.get(&key, &req), Lookup::Hit("Verdict: YES".into()));
        // No temp files left behind.
        assert_eq!(std::fs::read_dir(dir.path().join("judge")).unwrap().count(), 1);

        std::fs::write(cache.path(&key), b"{\"request\": ").unwrap();
        assert!(matches!(cache.get(&key, &req), Lookup::Corrupt(w) if w.contains("not JSON")));
        assert!(!cache.path(&key).exists(), "a corrupt entry is removed");

        cache.put(&key, &json!({"body": {"model": "other"}}), &response("x")).unwrap();
        assert!(matches!(cache.get(&key, &req), Lookup::Corrupt(w) if w.contains("another request")));
        cache.put(&key, &req, &json!({"choices": []})).unwrap();
        assert!(matches!(cache.get(&key, &req), Lookup::Corrupt(w) if w.contains("no reply")));
        assert_eq!(cache.get(&key, &req), Lookup::Miss);
    }
}
