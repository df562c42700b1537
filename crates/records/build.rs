//! Generates Rust types for kubelet's device plugin `ContainerAllocateResponse` (the `AllocResp`
//! of its device-manager checkpoint), `proto/deviceplugin/v1beta1/allocate.proto`, with protox (a
//! protobuf compiler in Rust, so neither `protoc` nor any system package is needed) and
//! prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 1] = ["proto/deviceplugin/v1beta1/allocate.proto"];
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
