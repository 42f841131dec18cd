//! Hashing: canonical JSON for cache keys, sha256 of files and artifact manifests.
//!
//! Keys must not depend on map order, whitespace or the machine's paths, so everything hashed is
//! first rendered as canonical JSON (sorted keys, no spaces).

use std::io::Read;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::{IoContext, Result};

/// Render a JSON value with object keys sorted recursively (independent of serde_json features).
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_canonical(&map[*k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub fn sha256_json(v: &Value) -> String {
    sha256_hex(canonical_json(v).as_bytes())
}

/// Streamed sha256 of a file's bytes.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).at(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Content hash of an artifact from its (relative path, file sha256) list: order-independent.
pub fn manifest_hash(files: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = files.iter().collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    for (path, sha) in sorted {
        hasher.update(path.as_bytes());
        hasher.update([0u8]);
        hasher.update(sha.as_bytes());
        hasher.update([b'\n']);
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": "s"}});
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,{"c":3,"d":2}]},"b":1}"#);
    }

    #[test]
    fn manifest_hash_ignores_order_but_not_content() {
        let a = vec![("x".to_string(), "1".to_string()), ("y".to_string(), "2".to_string())];
        let b = vec![a[1].clone(), a[0].clone()];
        assert_eq!(manifest_hash(&a), manifest_hash(&b));
        let c = vec![("x".to_string(), "1".to_string()), ("y".to_string(), "3".to_string())];
        assert_ne!(manifest_hash(&a), manifest_hash(&c));
    }
}
