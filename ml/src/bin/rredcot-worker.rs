//! `rredcot-worker`: the same CLI with every builtin, the ML stages included, and `serve`
//! (links libtorch).

use rredcot_ml::{cpu_cache, model::head};

/// A bad setting of the environment: said, and nothing runs (exit code 2).
fn refuse(e: String) -> ! {
    eprintln!("rredcot-worker: {e}");
    std::process::exit(2);
}

fn main() {
    // Before the first tensor: the caching CPU allocator (ml/src/cpu_cache.rs says why).
    match cpu_cache::install_from_env() {
        Ok(cpu_cache::Setup::Installed | cpu_cache::Setup::Off) => {}
        Ok(cpu_cache::Setup::Unavailable) => {
            eprintln!("rredcot-worker: warning: libtorch's CPU allocator is used (the caching one could not be installed)")
        }
        Err(e) => refuse(e),
    }
    // The LM head's piece size (ml/src/model/head.rs).
    match head::logits_at_once_from_env() {
        Ok(Some(n)) => head::set_logits_at_once(n),
        Ok(None) => {}
        Err(e) => refuse(e),
    }
    let code = rredcot::cli::main(&rredcot_ml::stages::FULL_RUNTIME, Some(rredcot_ml::serve::run));
    // An engine kept between stages (param `reload`) gets SIGTERM and its grace period, rather
    // than its guardian's SIGKILL at exit.
    rredcot_ml::sampling::http::release_parked();
    std::process::exit(code);
}
