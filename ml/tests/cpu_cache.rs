//! The caching CPU allocator (ml/src/cpu_cache.rs) in a process of its own: freed large blocks
//! serve the next tensor that fits, no two live tensors ever share memory, the cache is trimmed
//! to its limit before new memory is taken and empties on request; the worker refuses a bad
//! `RREDCOT_CPU_CACHE_MB`, or a bad `RREDCOT_HEAD_LOGITS` (its other memory setting).

use rand::{Rng, SeedableRng};
use rredcot_ml::cpu_cache;
use tch::{Device, Kind, Tensor};

const MIB: u64 = 1 << 20;

/// A float32 tensor of `bytes` (a multiple of 4) filled with `value`.
fn filled(bytes: u64, value: f64) -> Tensor {
    let mut t = Tensor::empty([(bytes / 4) as i64], (Kind::Float, Device::Cpu));
    let _ = t.fill_(value);
    t
}

fn holds_only(t: &Tensor, value: f64) -> bool {
    t.min().double_value(&[]) == value && t.max().double_value(&[]) == value
}

#[test]
fn freed_blocks_are_reused_never_shared_and_trimmed_to_the_limit() {
    let limit = 64 * MIB;
    assert!(cpu_cache::install(limit), "the cache could not be installed");

    // A freed block serves the next tensor of its size, or a little larger; not a much larger one.
    let before = cpu_cache::stats();
    drop(filled(10 * MIB + 40 * 1024, 1.0));
    assert!(cpu_cache::stats().cached_bytes >= 10 * MIB);
    let again = filled(10 * MIB + 512 * 1024, 2.0);
    let after = cpu_cache::stats();
    assert_eq!(after.hits, before.hits + 1, "{before:?} -> {after:?}");
    assert_eq!(after.cached_bytes, 0);
    drop(again);
    let bigger = filled(20 * MIB, 3.0);
    assert_eq!(cpu_cache::stats().hits, after.hits, "a 20 MiB tensor took a 10 MiB block");
    drop(bigger);
    // Small tensors bypass it.
    let hits = cpu_cache::stats();
    drop(filled(64 * 1024, 1.0));
    let _small = filled(64 * 1024, 1.0);
    assert_eq!(cpu_cache::stats().hits, hits.hits);

    // Many live tensors of mixed sizes, freed and made in random order: each keeps its own value
    // (a block handed to two tensors would show the other's), the cache holds at most its limit
    // whenever new memory is taken, and it both reuses and gives back blocks.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut live: Vec<(Tensor, f64)> = Vec::new();
    let start = cpu_cache::stats();
    for i in 0..400 {
        if live.len() > 6 || (!live.is_empty() && rng.random_bool(0.4)) {
            let (t, v) = live.swap_remove(rng.random_range(0..live.len()));
            assert!(holds_only(&t, v), "step {i}: a tensor's memory changed under it");
        } else {
            let bytes = rng.random_range(MIB / 4..12 * MIB) / 4 * 4;
            let before = cpu_cache::stats();
            live.push((filled(bytes, i as f64), i as f64));
            let after = cpu_cache::stats();
            // New memory is taken only with the cache trimmed to its limit.
            if after.misses > before.misses {
                assert!(after.cached_bytes <= limit, "step {i}: {before:?} -> {after:?}");
            }
        }
        if i % 25 == 0 {
            for (t, v) in &live {
                assert!(holds_only(t, *v), "step {i}: a live tensor was overwritten");
            }
        }
    }
    let end = cpu_cache::stats();
    assert!(end.hits > start.hits + 50, "{start:?} -> {end:?}");
    assert!(end.evictions > start.evictions, "{start:?} -> {end:?}");
    for (t, v) in &live {
        assert!(holds_only(t, *v));
    }

    drop(live);
    assert!(cpu_cache::stats().cached_bytes > 0);
    cpu_cache::release();
    assert_eq!(cpu_cache::stats().cached_bytes, 0);
    // Tensors still work after a release.
    assert!(holds_only(&filled(8 * MIB, 5.0), 5.0));
}

#[test]
fn the_worker_refuses_a_bad_cache_limit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rredcot-worker"))
        .arg("--version")
        .env("RREDCOT_CPU_CACHE_MB", "two gigs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RREDCOT_CPU_CACHE_MB=\"two gigs\"") && err.contains("MiB"), "{err}");
    for ok in ["0", "512"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rredcot-worker"))
            .arg("--version")
            .env("RREDCOT_CPU_CACHE_MB", ok)
            .output()
            .unwrap();
        assert!(out.status.success(), "{ok}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The worker's other memory setting read at its start, the LM head's piece size
/// (ml/src/model/head.rs): a bad value is refused before anything runs.
#[test]
fn the_worker_refuses_a_bad_head_piece_size() {
    for bad in ["0", "-5", "1e6", "lots"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rredcot-worker"))
            .arg("--version")
            .env("RREDCOT_HEAD_LOGITS", bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("RREDCOT_HEAD_LOGITS={bad:?}")) && err.contains("positive number"), "{err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rredcot-worker"))
        .arg("--version")
        .env("RREDCOT_HEAD_LOGITS", "16777216")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
