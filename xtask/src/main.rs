//! Build steps that cargo alone cannot express.
//!
//! `cargo run -p xtask -- component` builds `relay-component` for
//! wasm32-unknown-unknown, strips DWARF, encodes it as a component with
//! wit-component (no adapter: it imports no WASI), validates it, and checks
//! that its only imports are the `relay:core` host interface and types, and
//! that no wasm-bindgen import leaked in. The result is
//! `target/component/relay_core.wasm`.
//!
//! `bindgen` generates the Node host's glue for the wasm-bindgen build of the core
//! (`relay-wasm`) into `host-node/pkg/`; `bindgen-edge` generates the web-target glue of the
//! same wasm into `host-node/pkg/web/`, for workerd (relay-node's `workerd` export).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use wasmparser::{Parser, Payload, Validator, WasmFeatures};

type Result<T> = std::result::Result<T, String>;

mod lines;

/// Imports a relay core component may have; anything else fails the build.
const ALLOWED_IMPORTS: &[&str] = &["relay:core/host@0.9.0", "relay:core/types@0.9.0"];
/// The interface a relay core component must export: the product's API.
const EXPORT: &str = "relay:core/relay@0.9.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("component") => build_component(),
        Some("bindgen") => build_bindgen(),
        Some("bindgen-edge") => build_bindgen_edge(),
        Some("lines") => lines::run(args.get(1).map(String::as_str)),
        Some("check-component") => match args.get(1) {
            Some(p) => std::fs::read(p)
                .map_err(|e| format!("{p}: {e}"))
                .and_then(|b| check(&b)),
            None => Err("usage: xtask check-component FILE".into()),
        },
        _ => Err(
            "usage: xtask component | bindgen | bindgen-edge | check-component FILE | lines [COMMIT]"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds one package for wasm32-unknown-unknown in its own cargo invocation, so that the
/// component and the wasm-bindgen crate never unify features (getrandom's JS backend, wasm-bindgen).
/// Returns the target directory.
fn build_wasm(package: &str) -> Result<PathBuf> {
    let root = root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args([
            "build",
            "--locked",
            "--release",
            "-p",
            package,
            "--target",
            "wasm32-unknown-unknown",
        ])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building {package} failed"));
    }
    Ok(std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target")))
}

fn build_component() -> Result<()> {
    let target = build_wasm("relay-component")?;
    let module = std::fs::read(target.join("wasm32-unknown-unknown/release/relay_component.wasm"))
        .map_err(|e| format!("reading the core module: {e}"))?;
    let module = strip_debug(&module)?;
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .map_err(|e| format!("component encoding: {e:#}"))?
        .validate(true)
        .encode()
        .map_err(|e| format!("component encoding: {e:#}"))?;
    check(&component)?;
    let out = target.join("component");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let path = out.join("relay_core.wasm");
    std::fs::write(&path, &component).map_err(|e| e.to_string())?;
    println!("{} ({} bytes)", display(&path), component.len());
    Ok(())
}

/// Builds `relay-wasm` and generates the Node ES module into `host-node/pkg/`, and beside
/// it the same core as a classic script (`relay_wasm_script.js`, wasm-bindgen's no-modules
/// target), from which the Node host makes its core instances: each evaluation is an
/// instance of its own that is garbage once dropped (an imported ES module never is).
fn build_bindgen() -> Result<()> {
    let root = root();
    let stripped = relay_wasm()?;
    let out = root.join("host-node/pkg");
    let mut b = wasm_bindgen_cli_support::Bindgen::new();
    b.input_path(&stripped)
        .out_name("relay_wasm")
        .nodejs_module(true)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?
        .typescript(true);
    b.generate(&out)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?;
    let mut b = wasm_bindgen_cli_support::Bindgen::new();
    b.input_path(&stripped)
        .out_name("relay_wasm_script")
        .no_modules(true)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?
        .typescript(false);
    b.generate(&out)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?;
    build_settings_js(&out)?;
    println!("{}", display(&out));
    build_native(&out)
}

/// Builds `relay-settings-js` (the command line every host shares) and generates its Node ES
/// module into `out` (`relay_settings.js`): the launchers load it, the cores never do.
fn build_settings_js(out: &Path) -> Result<()> {
    let target = build_wasm("relay-settings-js")?;
    let input = target.join("wasm32-unknown-unknown/release/relay_settings_js.wasm");
    let stripped = target.join("wasm32-unknown-unknown/release/relay_settings_js.stripped.wasm");
    let module = std::fs::read(&input).map_err(|e| format!("{}: {e}", input.display()))?;
    std::fs::write(&stripped, strip_debug(&module)?).map_err(|e| e.to_string())?;
    let mut b = wasm_bindgen_cli_support::Bindgen::new();
    b.input_path(&stripped)
        .out_name("relay_settings")
        .nodejs_module(true)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?
        .typescript(true);
    b.generate(out)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?;
    // The environment knobs, from the one table (relay-settings' `KNOBS`): the Node host
    // reads them by it (src/tuning.js), without loading this module.
    std::fs::write(
        out.join("tuning.json"),
        relay_settings::tuning::knobs_json(),
    )
    .map_err(|e| e.to_string())
}

/// Builds `relay-wasm` for wasm32-unknown-unknown and writes it without DWARF beside itself;
/// returns the stripped module's path.
fn relay_wasm() -> Result<PathBuf> {
    let target = build_wasm("relay-wasm")?;
    let input = target.join("wasm32-unknown-unknown/release/relay_wasm.wasm");
    let stripped = target.join("wasm32-unknown-unknown/release/relay_wasm.stripped.wasm");
    let module = std::fs::read(&input).map_err(|e| format!("{}: {e}", input.display()))?;
    std::fs::write(&stripped, strip_debug(&module)?).map_err(|e| e.to_string())?;
    Ok(stripped)
}

/// Builds `relay-wasm` and generates the web-target glue into `host-edge/pkg/`: an ES module
/// (`relay_wasm.js`) whose `initSync({module})` takes the `.wasm` as the `WebAssembly.Module`
/// workerd gives a Worker that imports it, with `__wbg_reset_state()`, which replaces a
/// trapped instance with a fresh one of the same module (the Node host loads a fresh script
/// instead; workerd evaluates no code at run time). The same wasm as the Node host's.
fn build_bindgen_edge() -> Result<()> {
    let stripped = relay_wasm()?;
    let out = root().join("host-node/pkg/web");
    let mut b = wasm_bindgen_cli_support::Bindgen::new();
    b.input_path(&stripped)
        .out_name("relay_wasm")
        .web(true)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?
        .reset_state_function(true)
        .typescript(true);
    b.generate(&out)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))?;
    println!("{}", display(&out));
    Ok(())
}

/// Builds the Node host's native crypto addon (`relay-node-native`) into its platform's npm
/// package, `host-node/npm/<platform>/` (`relay-node-linux-x64-gnu`, ...), the napi-rs way:
/// `relay-node` names each platform's package as an optional dependency, npm installs only the
/// one whose `os`, `cpu` and `libc` match, and `src/native.js` loads that one or none.
///
/// The Node host verifies Ed25519 through it as the wasmtime host does through its import;
/// without it (another platform, a failed install) the core verifies in wasm.
fn build_native(_pkg: &Path) -> Result<()> {
    let root = root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["build", "--locked", "--release", "-p", "relay-node-native"])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err("building relay-node-native failed".into());
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let lib = format!(
        "{}relay_node_native{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let (platform, os, cpu, libc) = node_platform()?;
    let dir = root.join("host-node/npm").join(&platform);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let from = target.join("release").join(&lib);
    let to = dir.join("relay_native.node");
    std::fs::copy(&from, &to).map_err(|e| format!("{}: {e}", from.display()))?;
    let version = package_version(&root.join("host-node/package.json"))?;
    let libc = libc
        .map(|l| format!(",\n  \"libc\": [\"{l}\"]"))
        .unwrap_or_default();
    let manifest = format!(
        "{{\n  \"name\": \"relay-node-{platform}\",\n  \"version\": \"{version}\",\n  \"description\": \"relay-node's native crypto (strict Ed25519, SHA-256) for {platform}\",\n  \"license\": \"Apache-2.0\",\n  \"main\": \"relay_native.node\",\n  \"files\": [\"relay_native.node\"],\n  \"os\": [\"{os}\"],\n  \"cpu\": [\"{cpu}\"]{libc}\n}}\n"
    );
    std::fs::write(dir.join("package.json"), manifest).map_err(|e| e.to_string())?;
    println!("{}", display(&to));
    Ok(())
}

/// This machine's platform as npm and napi-rs name it: `linux-x64-gnu`, with its `os`, `cpu`
/// and `libc` fields.
fn node_platform() -> Result<(String, &'static str, &'static str, Option<&'static str>)> {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        "windows" => "win32",
        other => other,
    };
    let cpu = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => return Err(format!("no npm name for the architecture {other}")),
    };
    let libc = match (os, cfg!(target_env = "musl")) {
        ("linux", true) => Some("musl"),
        ("linux", false) => Some("glibc"),
        _ => None,
    };
    let suffix = match libc {
        Some("musl") => "-musl",
        Some(_) => "-gnu",
        None => "",
    };
    Ok((format!("{os}-{cpu}{suffix}"), os, cpu, libc))
}

/// The `version` of a package.json.
fn package_version(file: &Path) -> Result<String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    json["version"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{}: no version", file.display()))
}

fn display(p: &Path) -> String {
    p.canonicalize()
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// Drops DWARF custom sections (the release profile keeps line tables for native backtraces).
fn strip_debug(module: &[u8]) -> Result<Vec<u8>> {
    let mut out = wasm_encoder::Module::new();
    for payload in Parser::new(0).parse_all(module) {
        let payload = payload.map_err(|e| e.to_string())?;
        if let Payload::CustomSection(c) = &payload {
            if c.name().starts_with(".debug") {
                continue;
            }
        }
        if let Some((id, range)) = payload.as_section() {
            out.section(&wasm_encoder::RawSection {
                id,
                data: &module[range],
            });
        }
    }
    Ok(out.finish())
}

/// Validates a component and checks its top-level imports.
fn check(component: &[u8]) -> Result<()> {
    if !Parser::is_component(component) {
        return Err("not a component".into());
    }
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(component)
        .map_err(|e| format!("validation: {e}"))?;
    let mut depth = 0usize;
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    for payload in Parser::new(0).parse_all(component) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(s) if depth == 0 => {
                for i in s {
                    imports.push(i.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(s) if depth == 0 => {
                for e in s {
                    exports.push(e.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    // Type imports from the world's `use` are plain names (no `:`); interfaces must be ours.
    let bad: Vec<&String> = imports
        .iter()
        .filter(|n| n.contains(':') && !ALLOWED_IMPORTS.contains(&n.as_str()))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "the component imports {bad:?}; only {ALLOWED_IMPORTS:?} are allowed"
        ));
    }
    if !exports.iter().any(|e| e == EXPORT) {
        return Err(format!(
            "the component exports {exports:?}, not the interface {EXPORT}"
        ));
    }
    if component
        .windows(b"__wbindgen".len())
        .any(|w| w == b"__wbindgen")
    {
        return Err("the component contains a __wbindgen import: wasm-bindgen leaked into the component build".into());
    }
    println!("component imports: {imports:?}; exports: {exports:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Every item a host writer reads in `wit/relay.wit` (the package, its interfaces and
    /// world, each type and each function) has a doc comment right above it: the WIT is the
    /// product's API, and `wasm-tools component wit` of the built component shows these docs.
    #[test]
    fn every_item_of_the_wit_has_a_doc_comment() {
        let wit = std::fs::read_to_string(super::root().join("wit/relay.wit")).unwrap();
        let lines: Vec<&str> = wit.lines().map(str::trim).collect();
        let item = |l: &str| {
            let first = l.split_whitespace().next().unwrap_or("");
            matches!(
                first,
                "package"
                    | "interface"
                    | "world"
                    | "record"
                    | "enum"
                    | "variant"
                    | "flags"
                    | "resource"
                    | "type"
            ) || l.contains(": func(")
                || l.contains(": static func(")
        };
        let mut undocumented = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if item(l) && !(i > 0 && lines[i - 1].starts_with("///")) {
                undocumented.push(format!("line {}: {l}", i + 1));
            }
        }
        assert!(
            undocumented.is_empty(),
            "items without docs: {undocumented:#?}"
        );
        assert!(
            lines.iter().filter(|l| item(l)).count() > 40,
            "the check sees the items"
        );
    }
}
