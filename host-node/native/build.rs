// Node-API symbols resolve from the node process when the addon loads (linker flags where a platform needs them).
fn main() {
    napi_build::setup();
}
