//! The `vtax` binary: the command line of the agent library (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    vtax::main()
}
