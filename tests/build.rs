//! Compiles the OpenIM protobuf definitions with a pure-Rust protobuf compiler (protox), so no
//! system `protoc` is needed.

fn main() -> anyhow::Result<()> {
    let protos = ["proto/msggateway.proto", "proto/sdkws.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
