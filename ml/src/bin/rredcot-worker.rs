//! `rredcot-worker`: the same CLI with every builtin, the ML stages included (links libtorch).

fn main() {
    std::process::exit(rredcot::cli::main(&rredcot_ml::stages::FULL_RUNTIME));
}
