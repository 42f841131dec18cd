//! `rredcot-worker`: the same CLI with every builtin, the ML stages included, and `serve`
//! (links libtorch).

fn main() {
    std::process::exit(rredcot::cli::main(&rredcot_ml::stages::FULL_RUNTIME, Some(rredcot_ml::serve::run)));
}
