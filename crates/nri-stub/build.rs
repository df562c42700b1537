//! Generates Rust types from the vendored protobuf schemas with protox (a protobuf compiler in
//! Rust, so neither `protoc` nor any system package is needed) and prost-build:
//! - the NRI API (`proto/nri/api.proto`, containerd/nri v0.12.0) and the ttrpc envelope
//!   (`proto/ttrpc/ttrpc.proto`) that `gpufence nri` speaks.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 2] = ["proto/nri/api.proto", "proto/ttrpc/ttrpc.proto"];
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    prost_build::Config::new()
        // Maps decode into BTreeMap: one order for every reader, duplicates resolved as protobuf
        // says (last wins) — the checkpoint reader refuses them before that matters.
        .btree_map(["."])
        .compile_fds(fds)?;
    Ok(())
}
