//! `gpufence-runtime`: a drop-in for runc that enforces the plan on `create`/`run`.

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    gpufence::exit::finish("gpufence-runtime", gpufence::runtime::main(args))
}
