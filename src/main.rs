//! `rredcot`: the engine binary. It does not link libtorch, so a cached `pipeline run` is fast;
//! stages that need the ML code run in `rredcot-worker`.

fn main() {
    std::process::exit(rredcot::cli::main(&rredcot::stages::LIGHT_RUNTIME, None));
}
