//! The relay's command line (relay-settings) for the JavaScript hosts' launchers: `relay-node`
//! and `relay-edge serve` read their flags and TOML file with the definition the wasmtime
//! host links natively. A module of its own (`pkg/relay_settings.js`), so the module every
//! core instance and every edge Durable Object loads does not carry clap and toml.

use wasm_bindgen::prelude::*;

/// A command line of `host` (`relay-node`, `relay-edge`) read by the definition every
/// host shares (relay-settings): JSON `{"serve": settings}`, `{"admin": call}` or
/// `{"print": text}`; what cannot be taken throws its message, with the usage.
/// `readFile(path)` returns a file's text (the `--config` file, admin.url, admin.token).
#[wasm_bindgen(js_name = parseCommand)]
pub fn parse_command(
    host: &str,
    argv: Vec<String>,
    read_file: &js_sys::Function,
    cwd: &str,
) -> Result<String, JsValue> {
    let host = relay_settings::Host::named(host)
        .ok_or_else(|| JsValue::from(js_sys::Error::new(&format!("no host {host:?}"))))?;
    use wasm_bindgen::JsCast;
    let read = |p: &std::path::Path| {
        let got = read_file.call1(&JsValue::NULL, &JsValue::from_str(&p.to_string_lossy()));
        match got {
            Ok(text) => text.as_string().ok_or_else(|| "not text".to_string()),
            Err(e) => Err(e
                .dyn_ref::<js_sys::Error>()
                .map(|e| String::from(e.message()))
                .unwrap_or_else(|| format!("{e:?}"))),
        }
    };
    let fail = |e: relay_settings::Error| JsValue::from(js_sys::Error::new(&e.0));
    let out = match relay_settings::parse(host, argv, read).map_err(fail)? {
        // Written, not built as a Value: the limits keep the table's order.
        relay_settings::Parsed::Serve(s) => {
            let settings = serde_json::to_string(&*s).map_err(|e| JsValue::from(e.to_string()))?;
            return Ok(format!("{{\"serve\":{settings}}}"));
        }
        relay_settings::Parsed::Print(text) => serde_json::json!({ "print": text }),
        relay_settings::Parsed::Admin(a) => {
            let c = a.call(read, std::path::Path::new(cwd)).map_err(fail)?;
            serde_json::json!({ "admin": {
                "method": c.method,
                "url": c.url,
                "authorization": c.authorization,
                "body": String::from_utf8_lossy(&c.body),
                "view": c.view.as_str(),
            }})
        }
    };
    Ok(out.to_string())
}

/// A 200 admin answer as `relay-node admin` prints it: the same table or line `relay admin`
/// prints (`view` as the parsed call named it; `raw` prints the body as it came).
#[wasm_bindgen(js_name = renderAnswer)]
pub fn render_answer(view: &str, body: &str) -> String {
    relay_settings::render(relay_settings::View::named(view), body.as_bytes())
}
