use super::*;
use relay_core::transport::limits::LIMITS;
use std::path::PathBuf;

fn no_file(p: &Path) -> Result<String, String> {
    Err(format!("no file {}", p.display()))
}

fn serve(host: Host, argv: &[&str]) -> Result<Settings, String> {
    serve_with(host, argv, "")
}

fn serve_with(host: Host, argv: &[&str], file: &str) -> Result<Settings, String> {
    let words = std::iter::once("serve").chain(argv.iter().copied());
    match parse(host, words, |_| Ok(file.to_string())) {
        Ok(Parsed::Serve(s)) => Ok(*s),
        Ok(other) => panic!("not serve: {other:?}"),
        Err(e) => Err(e.0),
    }
}

#[test]
fn every_transport_limit_is_a_flag_and_a_key_of_the_same_name() {
    let argv: Vec<String> = LIMITS
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            [
                format!("--{}", l.name.replace('_', "-")),
                (i + 1).to_string(),
            ]
        })
        .collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let s = serve(Host::Wasmtime, &argv).unwrap();
    let file: String = LIMITS
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{} = {}\n", l.name, i + 11))
        .collect();
    let f = serve_with(Host::Node, &["--config", "r.toml"], &file).unwrap();
    for (i, l) in LIMITS.iter().enumerate() {
        assert_eq!(s.limits.get(l.name), Some(i as u64 + 1), "{}", l.name);
        assert_eq!(f.limits.get(l.name), Some(i as u64 + 11), "{}", l.name);
    }
}

#[test]
fn flags_override_the_file_and_the_file_overrides_the_defaults() {
    let file = "listen = \"127.0.0.1:9100\"\nnetwork = \"n1\"\nmemory = true\nca = \"a.pem\"\n\
                [policy]\nmessage_retention = 60000\nclock_tolerance = 5\n";
    let s = serve_with(
        Host::Wasmtime,
        &[
            "--config",
            "r.toml",
            "--policy",
            "clock_tolerance=1000",
            "--network",
            "n2",
            "--ca",
            "b.pem",
        ],
        file,
    )
    .unwrap();
    assert_eq!(s.listen.to_string(), "127.0.0.1:9100");
    assert_eq!((s.data, s.network.as_str()), (None, "n2"));
    assert_eq!(
        (s.policies.message_retention, s.policies.clock_tolerance),
        (60_000, 1000)
    );
    assert_eq!(s.policy.len(), 2, "the policies given, by name");
    assert_eq!(s.ca, vec![PathBuf::from("a.pem"), PathBuf::from("b.pem")]);
    let d = serve(Host::Wasmtime, &[]).unwrap();
    assert_eq!(d, Settings::default());
    assert_eq!(
        serve(Host::Edge, &[]).unwrap().data,
        Some(PathBuf::from(".relay-edge"))
    );
}

#[test]
fn bad_values_are_refused_naming_the_flag_or_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["--policy", "x=1.5"], "NAME=INTEGER"),
        (&["--policy", "nope=1"], "unknown policy"),
        (&["--header-timeout", "0"], "positive integer"),
        (&["--header-timeout", "-1"], "positive integer"),
        (&["--max-pending", "1.5"], "positive integer"),
        (&["--shards", "0"], "positive integer"),
        (&["--log-format", "yaml"], "text or json"),
        (&["--admin-listen", "localhost"], "HOST:PORT"),
        (&["--tls-cert", "c.pem"], "go together"),
        (&["--nope"], "unexpected argument '--nope'"),
        (&["--attempt-timeout", "soon"], "milliseconds"),
    ];
    for (argv, says) in cases {
        let e = serve(Host::Wasmtime, argv).unwrap_err();
        assert!(e.contains(says), "{argv:?}: {e}");
        let hint = e.contains("Usage: relay serve") || e.contains("try '--help'");
        assert!(hint, "{argv:?} carries the usage or where to find it: {e}");
    }
    for (file, says) in [
        ("lisen = \"x\"", "unknown field `lisen`"),
        (
            "max_pending = 0",
            "the key max_pending: max_pending must be a positive integer",
        ),
        ("allow_private_peers = \"yes\"", "allow_private_peers"),
        ("config = \"other.toml\"", "unknown field `config`"),
    ] {
        let e = serve_with(Host::Wasmtime, &["--config", "r.toml"], file).unwrap_err();
        assert!(e.contains(says), "{file}: {e}");
    }
    let e = parse(Host::Node, ["serve", "--config", "gone.toml"], no_file).unwrap_err();
    assert!(e.0.contains("--config gone.toml: no file gone.toml"), "{e}");
}

#[test]
fn each_host_refuses_the_flags_it_cannot_honour() {
    for (host, argv, says) in [
        (
            Host::Edge,
            &["--tls-cert", "c.pem", "--tls-key", "k.pem"][..],
            "relay-edge does not take --tls-cert",
        ),
        (
            Host::Edge,
            &["--max-pending", "4"],
            "relay-edge does not take --max-pending",
        ),
        (
            Host::Edge,
            &["--memory"],
            "relay-edge does not take --memory",
        ),
        (
            Host::Edge,
            &["--config", "r.toml"],
            "relay-edge does not take --config",
        ),
        (
            Host::Node,
            &["--shards", "4"],
            "relay-node does not take --shards",
        ),
        (
            Host::Node,
            &["--component", "c.wasm"],
            "relay-node does not take --component",
        ),
        (
            Host::Wasmtime,
            &["--no-probe-peers"],
            "relay does not take --no-probe-peers",
        ),
    ] {
        let e = serve(host, argv).unwrap_err();
        assert!(e.contains(says), "{host:?} {argv:?}: {e}");
    }
    let e = serve_with(Host::Node, &["--config", "r.toml"], "shards = 2").unwrap_err();
    assert!(e.contains("relay-node does not take the key shards"), "{e}");
    let s = serve(
        Host::Edge,
        &["--shards", "4", "--no-probe-peers", "--allow-private-peers"],
    )
    .unwrap();
    assert_eq!(
        (s.shards, s.probe_peers, s.allow_private_peers),
        (4, false, true)
    );
    // What a host does not take is not in its help either.
    let Ok(Parsed::Print(help)) = parse(Host::Edge, ["serve", "--help"], no_file) else {
        panic!("help is printed")
    };
    assert!(
        help.contains("--shards") && !help.contains("--tls-cert"),
        "{help}"
    );
}

#[test]
fn the_settings_serialize_as_the_javascript_hosts_take_them() {
    let s = serve(
        Host::Node,
        &["--policy", "clock_tolerance=1000", "--max-pending", "5"],
    )
    .unwrap();
    let v = serde_json::to_string(&s).unwrap();
    assert!(
        v.starts_with(
            r#"{"listen":"127.0.0.1:8080","adminListen":"127.0.0.1:0","logFormat":"text""#
        ),
        "{v}"
    );
    assert!(v.contains(r#""policies":{"clock_tolerance":1000}"#), "{v}");
    assert!(v.contains(r#""limits":{"headerTimeout":10000,"bodyTimeout":30000,"idleTimeout":60000,"wsPingInterval":30000,"maxConnections":1000,"maxConnectionsPerIp":64,"wsSendQueue":256,"maxPending":5}"#), "{v}");
}

#[test]
fn admin_commands_make_the_call_the_relay_expects() {
    let files = |p: &Path| match p.file_name().and_then(|n| n.to_str()) {
        Some("admin.url") => Ok("http://127.0.0.1:5/\n".to_string()),
        Some("admin.token") => Ok("tok\n".to_string()),
        _ => Err("no".to_string()),
    };
    let admin = |argv: &[&str]| match parse(Host::Node, argv.iter().copied(), no_file) {
        Ok(Parsed::Admin(a)) => a,
        other => panic!("{argv:?}: {other:?}"),
    };
    let a = admin(&[
        "admin",
        "backup",
        "--data",
        "d",
        "out.sqlite",
        "--shard",
        "2",
    ]);
    let c = a.call(files, Path::new("/here")).unwrap();
    assert_eq!(
        (
            c.method,
            c.url.as_str(),
            c.authorization.as_deref(),
            c.body.as_slice()
        ),
        (
            "POST",
            "http://127.0.0.1:5/admin/v1/backup?shard=2",
            Some("Bearer tok"),
            &br#"{"path":"/here/out.sqlite"}"#[..]
        )
    );
    let c = admin(&["admin", "--admin-url", "http://h:1", "deliveries", "failed"])
        .call(files, Path::new("/"))
        .unwrap();
    assert_eq!(
        (c.url.as_str(), c.body.as_slice()),
        (
            "http://h:1/admin/v1/deliveries?shard=0",
            &br#"{"state":"failed"}"#[..]
        )
    );
    let c = admin(&[
        "admin",
        "--admin-url",
        "http://h:1",
        "destinations",
        "--failing",
        "--limit",
        "5",
        "--after",
        "https://b.example",
    ])
    .call(files, Path::new("/"))
    .unwrap();
    assert_eq!(
        (c.url.as_str(), c.body.as_slice()),
        (
            "http://h:1/admin/v1/destinations?shard=0",
            &br#"{"after":"https://b.example","failing":true,"limit":5}"#[..]
        )
    );
    let c = admin(&[
        "admin",
        "--admin-url",
        "http://h:1",
        "deliveries",
        "--after",
        "d\nt",
    ])
    .call(files, Path::new("/"))
    .unwrap();
    assert_eq!(c.body.as_slice(), &br#"{"after":"d\nt"}"#[..]);
    let c = admin(&[
        "admin",
        "--admin-url",
        "http://h:1",
        "retry",
        "https://b.example",
    ])
    .call(files, Path::new("/"))
    .unwrap();
    assert_eq!(
        (c.url.as_str(), c.body.as_slice()),
        (
            "http://h:1/admin/v1/destination.retry?shard=0",
            &br#"{"destination":"https://b.example"}"#[..]
        )
    );
    let c = admin(&[
        "admin",
        "--admin-url",
        "http://h:1",
        "retry-delivery",
        "ACC",
        "MID",
    ])
    .call(files, Path::new("/"))
    .unwrap();
    assert_eq!(
        (c.url.as_str(), c.body.as_slice()),
        (
            "http://h:1/admin/v1/delivery.retry?shard=0",
            &br#"{"from":"ACC","message_id":"MID"}"#[..]
        )
    );
    for (verb, method, body) in [
        ("quarantine-drop", "quarantine.drop", r#"{"id":"ZHVl"}"#),
        (
            "quarantine-requeue",
            "quarantine.requeue",
            r#"{"id":"ZHVl"}"#,
        ),
    ] {
        let c = admin(&["admin", "--admin-url", "http://h:1", verb, "ZHVl"])
            .call(files, Path::new("/"))
            .unwrap();
        assert_eq!(
            (c.url, c.body),
            (
                format!("http://h:1/admin/v1/{method}?shard=0"),
                body.as_bytes().to_vec()
            )
        );
    }
    for (verb, method) in [
        ("pause", "destination.pause"),
        ("resume", "destination.resume"),
    ] {
        let c = admin(&[
            "admin",
            "--admin-url",
            "http://h:1",
            verb,
            "https://b.example",
        ])
        .call(files, Path::new("/"))
        .unwrap();
        assert_eq!(
            (c.url, c.body),
            (
                format!("http://h:1/admin/v1/{method}?shard=0"),
                br#"{"destination":"https://b.example"}"#.to_vec()
            )
        );
    }
    let c = admin(&["admin", "metrics"])
        .call(no_file, Path::new("/"))
        .unwrap_err();
    assert!(c.0.contains("admin.url") && c.0.contains("--url"), "{c}");
    for (bad, says) in [
        (&["admin", "backup"][..], "Usage: relay-node admin backup"),
        (
            &["admin", "deliveries", "lost"],
            "[possible values: pending, failed]",
        ),
        (
            &["admin", "drop", "everything"],
            "unrecognized subcommand 'drop'",
        ),
    ] {
        let e = parse(Host::Node, bad.iter().copied(), no_file).unwrap_err();
        assert!(e.0.contains(says), "{bad:?}: {e}");
    }
    assert!(
        matches!(parse(Host::Wasmtime, ["--version"], no_file), Ok(Parsed::Print(v)) if v.starts_with("relay "))
    );
}

#[test]
fn the_engine_options_reach_the_core_under_its_own_keys() {
    let file = "attempt_timeout = 1500\nmax_in_flight_per_destination = 2\n";
    let argv = ["--config", "r.toml", "--max-in-flight-per-destination", "4"];
    for host in [Host::Wasmtime, Host::Node, Host::Edge] {
        let argv = if host == Host::Edge {
            &argv[2..]
        } else {
            &argv[..]
        };
        let s = serve_with(host, argv, file).unwrap();
        assert_eq!(s.engine.max_in_flight_per_destination, Some(4), "{host:?}");
    }
    let s = serve_with(Host::Node, &argv, file).unwrap();
    assert_eq!(
        s.engine,
        Engine {
            attempt_timeout: Some(1500),
            max_in_flight_per_destination: Some(4)
        }
    );
    // What a JavaScript host splices into the configuration it hands the core.
    let mut config = serde_json::to_value(&s).unwrap()["engine"].clone();
    config["relay"] = "http://127.0.0.1:8080".into();
    config["network"] = "dev".into();
    let c = relay_core::engine::Config::from_json(config.to_string().as_bytes()).unwrap();
    assert_eq!(
        (c.attempt_timeout, c.max_in_flight_per_destination),
        (1500, 4)
    );
    let e = serve(Host::Edge, &["--max-in-flight-per-destination", "0"]).unwrap_err();
    assert!(e.contains("positive integer"), "{e}");
    let zero = "max_in_flight_per_destination = 0\n";
    let e = serve_with(Host::Wasmtime, &["--config", "r.toml"], zero).unwrap_err();
    assert!(
        e.contains("the key max_in_flight_per_destination: must be a positive integer"),
        "{e}"
    );
}

#[test]
fn admin_answers_print_as_tables_and_lines_and_as_they_came_under_json() {
    let answer = br#"{"destinations":[{"consecutive_failures":3,"destination":"https://b.example","failed":1,"failing_since":1796607000000,"in_flight":0,"last_error":{"code":"unavailable","message":"connection refused"},"next_attempt_at":1796607062000,"oldest_pending_age_ms":3723000,"oldest_pending_at":1796603277000,"paused":false,"pending":2},{"consecutive_failures":0,"destination":"https://c.example","failed":0,"in_flight":1,"last_success_at":1796607000000,"paused":true,"pending":1}],"next":"https://c.example"}"#;
    let text = render(View::Destinations, answer);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0]
            .starts_with("DESTINATION        PENDING  IN-FLIGHT  FAILED  FAILURES  FAILING-SINCE"),
        "{text}"
    );
    let b: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        b,
        [
            "https://b.example",
            "2",
            "0",
            "1",
            "3",
            "2026-12-07T01:30:00Z",
            "-",
            "2026-12-07T01:31:02Z",
            "1h2m",
            "no",
            "unavailable:",
            "connection",
            "refused"
        ],
        "{text}"
    );
    let c: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        c,
        [
            "https://c.example",
            "1",
            "1",
            "0",
            "0",
            "-",
            "2026-12-07T01:30:00Z",
            "-",
            "-",
            "yes",
            "-"
        ],
        "{text}"
    );
    assert_eq!(
        lines[3],
        "(2 destinations; more: --after https://c.example)"
    );
    // An action is one line; --json (Raw) and a body of another shape print as they came.
    assert_eq!(
        render(
            View::Action,
            br#"{"brought_forward":3,"destination":"https://b.example"}"#
        ),
        "brought_forward=3 destination=https://b.example\n"
    );
    assert_eq!(
        render(View::Raw, answer),
        format!("{}\n", std::str::from_utf8(answer).unwrap())
    );
    assert_eq!(render(View::Destinations, b"not json"), "not json\n");
    // A deliveries cursor holds a line break: quoted so the shell gives it back whole.
    let page = render(
        View::Deliveries,
        b"{\"deliveries\":[],\"next\":\"https://b\\na.b\"}",
    );
    assert!(
        page.ends_with("(0 deliveries; more: --after $'https://b\\na.b')\n"),
        "{page}"
    );
    let q = render(
        View::Quarantine,
        br#"{"quarantined":[{"at":1796607000000,"code":"internal","entry":"due/1/x","id":"ZHVl","message":"bad record"}]}"#,
    );
    assert!(
        q.contains("ZHVl  2026-12-07T01:30:00Z  internal  bad record  due/1/x"),
        "{q}"
    );
}

#[test]
fn relayctl_admin_takes_the_same_operator_calls_under_its_own_name() {
    let files = |p: &Path| match p.file_name().and_then(|n| n.to_str()) {
        Some("admin.url") => Ok("http://127.0.0.1:5/\n".to_string()),
        Some("admin.token") => Ok("tok\n".to_string()),
        _ => Err("no".to_string()),
    };
    let Ok(Parsed::Admin(a)) =
        parse_admin("relayctl admin", ["--json", "destinations", "--failing"])
    else {
        panic!("not an admin call")
    };
    let c = a.call(files, Path::new("/")).unwrap();
    assert_eq!(
        (c.url.as_str(), c.body.as_slice(), c.view),
        (
            "http://127.0.0.1:5/admin/v1/destinations?shard=0",
            &br#"{"failing":true}"#[..],
            View::Raw
        )
    );
    let e = parse_admin("relayctl admin", ["pause"]).unwrap_err();
    assert!(
        e.0.contains("Usage: relayctl admin pause <DESTINATION>"),
        "{e}"
    );
}

#[test]
fn the_edge_keeps_within_six_outbound_connections_per_destination_by_default() {
    let edge = serve(Host::Edge, &[]).unwrap();
    assert_eq!(edge.engine.max_in_flight_per_destination, Some(6));
    let edge = serve(Host::Edge, &["--max-in-flight-per-destination", "3"]).unwrap();
    assert_eq!(edge.engine.max_in_flight_per_destination, Some(3));
    for host in [Host::Wasmtime, Host::Node] {
        // The core's own default (16) applies.
        assert_eq!(
            serve(host, &[])
                .unwrap()
                .engine
                .max_in_flight_per_destination,
            None
        );
    }
}
