//! The deployment files: the Grafana dashboard queries only metrics Keel exports, the
//! compose file wires the stack the way docs/operations.md says and never publishes an
//! unauthenticated API, its services meet only on the networks they need and its database
//! password is the deployment's own, and the proxy example of deploy/proxy/ forwards only
//! identities its signer made and reaches the signer on a socket only nginx shares; the
//! signer itself runs here (on a port and on a socket) and its tokens are checked.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::wait_for;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use keel_client::{RuntimeMode, Session};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(path(relative)).unwrap()
}

/// Metric names as Prometheus sees them after the collector's OTLP translation (dots to
/// underscores, unit and `_total` suffixes), for the metrics Keel exports.
const EXPORTED: [&str; 10] = [
    "keel_queue_depth",
    "keel_queue_oldest_age_seconds",
    "keel_job_wait_seconds",
    "keel_job_duration_seconds",
    "keel_claims_total",
    "keel_lease_renewals_total",
    "keel_lease_losses_total",
    "keel_reclaims_total",
    "keel_workers_alive",
    "http_server_request_duration_seconds",
];

/// The metric names a PromQL expression reads: label matchers (`{…}`) and grouping labels
/// (`by (…)`) are dropped first, then what remains that looks like a metric is one.
fn metric_names(expr: &str) -> Vec<String> {
    let mut selectors = String::new();
    let mut depth = 0;
    for c in expr.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => selectors.push(c),
            _ => {}
        }
    }
    for grouping in ["by (", "without ("] {
        while let Some(start) = selectors.find(grouping) {
            let end = start + selectors[start..].find(')').expect("a closed grouping");
            selectors.replace_range(start..=end, "");
        }
    }
    selectors
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("keel_") || word.starts_with("http_"))
        .map(|word| {
            word.trim_end_matches("_bucket")
                .trim_end_matches("_count")
                .to_string()
        })
        .collect()
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/keel.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut covered = std::collections::BTreeSet::new();
    for panel in panels {
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{} has no description",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{}: no metric in {expr}", panel["title"]);
            for name in names {
                assert!(
                    EXPORTED.contains(&name.as_str()),
                    "{}: {name} is not a metric Keel exports",
                    panel["title"]
                );
                covered.insert(name);
            }
        }
    }
    assert_eq!(
        covered.len(),
        EXPORTED.len(),
        "every exported metric has a panel: {covered:?}"
    );
}

/// The dashboard's names are the Prometheus forms of names the code really registers
/// (src/telemetry/metrics.rs): dots become underscores, then a unit or `_total` suffix.
#[test]
fn the_dashboards_metric_names_are_the_ones_the_code_registers() {
    let source = read("src/telemetry/metrics.rs");
    let registered: Vec<String> = source
        .split('"')
        .filter(|literal| literal.starts_with("keel.") || literal.starts_with("http.server."))
        .map(|name| name.replace('.', "_"))
        .collect();
    for exported in EXPORTED {
        let base = exported
            .trim_end_matches("_total")
            .trim_end_matches("_seconds");
        assert!(
            registered.iter().any(|r| r == base),
            "{exported} matches no metric in the code: {registered:?}"
        );
    }
}

#[test]
fn the_compose_stack_is_wired_as_documented() {
    let compose = read("docker-compose.yml");
    for service in [
        "postgres:",
        "migrate:",
        "api:",
        "worker:",
        "otel-collector:",
        "grafana:",
    ] {
        assert!(
            compose.contains(&format!("\n  {service}")),
            "no {service} service"
        );
    }
    for needle in [
        "pg_isready",                                // postgres health check
        "condition: service_healthy",                // migrate waits for postgres
        "condition: service_completed_successfully", // api and workers wait for migrate
        "http://127.0.0.1:8420/healthz",             // api health check
        "pgdata:/var/lib/postgresql/data",           // a named volume
        "OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector:4318",
    ] {
        assert!(
            compose.contains(needle),
            "docker-compose.yml lacks {needle}"
        );
    }
    let worker = &compose
        [compose.find("\n  worker:").unwrap()..compose.find("\n  otel-collector:").unwrap()];
    let fixed = worker
        .lines()
        .any(|l| l.trim_start().starts_with("ports:") || l.contains("container_name"));
    assert!(
        !fixed,
        "workers must scale by count: no fixed ports or names"
    );
    // The run sandbox's needs (docs/operations.md, "The run sandbox").
    for needle in ["KEEL_SANDBOX: isolated", "user: root", "seccomp=unconfined"] {
        assert!(worker.contains(needle), "the worker service lacks {needle}");
    }
    // Behind the proxy the workers are remote mode's: they enforce its rules (no sandbox
    // off, every run held to its limits, for which their cgroups must be writable).
    let proxy = read("deploy/proxy/docker-compose.proxy.yml");
    for name in ["worker", "worker-b"] {
        let block = service(&proxy, name);
        for needle in ["KEEL_REMOTE_MODE: \"1\"", "privileged: true"] {
            assert!(
                block.contains(needle),
                "{name} behind the proxy lacks {needle}"
            );
        }
    }
    let worker_b = service(&proxy, "worker-b");
    for needle in ["KEEL_SANDBOX: isolated", "user: root"] {
        assert!(worker_b.contains(needle), "worker-b lacks {needle}");
    }
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("USER keel") && dockerfile.matches("FROM ").count() == 2);
    assert!(dockerfile.contains("bubblewrap"), "the image lacks bwrap");
    assert!(
        dockerfile.contains("/src/target/release/keel-sandbox-shim /usr/local/bin/"),
        "the image lacks the sandbox shim beside keel"
    );
}

/// The block of one service (or top-level entry) of a compose file: its header line and the
/// lines indented deeper than it.
fn service<'a>(compose: &'a str, name: &str) -> &'a str {
    let header = format!("\n  {name}:\n");
    let start = compose
        .find(&header)
        .unwrap_or_else(|| panic!("no service {name}"))
        + 1;
    let body = &compose[start + header.len() - 1..];
    let len: usize = body
        .lines()
        .take_while(|line| line.is_empty() || line.starts_with("   "))
        .map(|line| line.len() + 1)
        .sum();
    &compose[start..(start + header.len() - 1 + len).min(compose.len())]
}

/// The value of `key:` in a compose block (an environment entry), unquoted.
fn setting<'a>(block: &'a str, key: &str) -> Option<&'a str> {
    block.lines().find_map(|line| {
        let value = line.trim().strip_prefix(key)?.strip_prefix(':')?;
        Some(value.trim().trim_matches('"'))
    })
}

/// Every entry of every `ports:` list in a compose file, unquoted.
fn published_ports(compose: &str) -> Vec<String> {
    let mut ports = Vec::new();
    let mut list_indent = None;
    for line in compose.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if let Some(key_indent) = list_indent {
            if trimmed.starts_with('#') {
                continue;
            }
            if let Some(entry) = trimmed.strip_prefix("- ").filter(|_| indent > key_indent) {
                ports.push(entry.trim_matches('"').to_string());
                continue;
            }
            list_indent = None;
        }
        if trimmed == "ports:" {
            list_indent = Some(indent);
        }
    }
    ports
}

/// Published on loopback: `127.0.0.1:…`, or a variable whose default is 127.0.0.1.
fn on_loopback(port: &str) -> bool {
    port.starts_with("127.0.0.1:") || (port.starts_with("${") && port.contains(":-127.0.0.1}:"))
}

#[test]
fn the_compose_api_needs_a_runtime_token_and_publishes_nothing_beyond_loopback() {
    let compose = read("docker-compose.yml");
    let api = service(&compose, "api");
    assert!(
        api.contains("KEEL_RUNTIME_TOKEN: ${KEEL_RUNTIME_TOKEN:?"),
        "the api takes KEEL_RUNTIME_TOKEN with compose's required-variable syntax:\n{api}"
    );
    // Only the API holds the token: not the shared settings, migrations or workers.
    let uses: Vec<&str> = compose
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') && line.contains("KEEL_RUNTIME_TOKEN"))
        .collect();
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert!(api.contains(uses[0]));

    let ports = published_ports(&compose);
    assert!(ports.len() >= 2, "{ports:?}");
    assert!(ports.iter().any(|p| p.ends_with(":8420:8420")), "{ports:?}");
    for port in &ports {
        assert!(on_loopback(port), "{port} is published beyond loopback");
    }

    let example = read(".env.example");
    assert!(example.lines().any(|l| l == "KEEL_RUNTIME_TOKEN="));
    assert!(example.contains("openssl rand -hex 32"));
    assert!(read(".gitignore").lines().any(|l| l == "/.env"));
}

#[test]
fn behind_the_proxy_only_nginx_is_published() {
    let proxy = read("deploy/proxy/docker-compose.proxy.yml");
    let nginx = published_ports(service(&proxy, "nginx"));
    assert_eq!(nginx, ["443:443", "80:80"]);
    assert_eq!(
        published_ports(&proxy),
        nginx,
        "no other service publishes a port"
    );
    for runtime in ["api", "api-b"] {
        let block = service(&proxy, runtime);
        assert_eq!(setting(block, "KEEL_REMOTE_MODE"), Some("1"), "{block}");
    }
}

/// One service of the compose stack as `docker compose -f docker-compose.yml -f
/// deploy/proxy/docker-compose.proxy.yml` sees it: the override's networks and volumes added
/// to the main file's, its environment entries over the main file's.
#[derive(Debug, Default)]
struct StackService {
    image: Option<String>,
    networks: std::collections::BTreeSet<String>,
    network_mode: Option<String>,
    volumes: Vec<String>,
    environment: BTreeMap<String, String>,
    healthcheck: Vec<String>,
}

/// A compose file as YAML, with its `<<:` merge keys applied.
fn compose_yaml(relative: &str) -> serde_yaml_ng::Value {
    let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(relative)).unwrap();
    yaml.apply_merge().unwrap();
    yaml
}

fn yaml_str(value: &serde_yaml_ng::Value) -> String {
    match value {
        serde_yaml_ng::Value::String(s) => s.clone(),
        serde_yaml_ng::Value::Null => String::new(),
        other => serde_yaml_ng::to_string(other).unwrap().trim().to_string(),
    }
}

/// The names of a list (`[a, b]`) or a mapping (`a: {}`).
fn yaml_names(value: &serde_yaml_ng::Value) -> Vec<String> {
    match value {
        serde_yaml_ng::Value::Sequence(items) => items.iter().map(yaml_str).collect(),
        serde_yaml_ng::Value::Mapping(entries) => entries.keys().map(yaml_str).collect(),
        serde_yaml_ng::Value::Null => Vec::new(),
        other => panic!("not a list: {other:?}"),
    }
}

const COMPOSE_FILES: [&str; 2] = [
    "docker-compose.yml",
    "deploy/proxy/docker-compose.proxy.yml",
];

/// The services of the main file and the proxy override together, and the networks they
/// declare (name → `internal`).
fn stack() -> (BTreeMap<String, StackService>, BTreeMap<String, bool>) {
    let mut services: BTreeMap<String, StackService> = BTreeMap::new();
    let mut networks = BTreeMap::new();
    for file in COMPOSE_FILES {
        let yaml = compose_yaml(file);
        for (name, service) in yaml["services"].as_mapping().unwrap() {
            let merged = services.entry(yaml_str(name)).or_default();
            if let Some(image) = service.get("image") {
                merged.image = Some(yaml_str(image));
            }
            if let Some(list) = service.get("networks") {
                merged.networks.extend(yaml_names(list));
            }
            if let Some(mode) = service.get("network_mode") {
                merged.network_mode = Some(yaml_str(mode));
            }
            if let Some(list) = service.get("volumes") {
                merged.volumes.extend(yaml_names(list));
            }
            if let Some(env) = service.get("environment").and_then(|e| e.as_mapping()) {
                for (key, value) in env {
                    merged.environment.insert(yaml_str(key), yaml_str(value));
                }
            }
            if let Some(test) = service.get("healthcheck").map(|h| &h["test"]) {
                merged.healthcheck = yaml_names(test);
            }
        }
        if let Some(declared) = yaml.get("networks").and_then(|n| n.as_mapping()) {
            for (name, network) in declared {
                let internal = network.get("internal").and_then(|i| i.as_bool());
                networks.insert(yaml_str(name), internal == Some(true));
            }
        }
    }
    (services, networks)
}

/// The services that join `network`.
fn members<'a>(
    services: &'a BTreeMap<String, StackService>,
    network: &str,
) -> std::collections::BTreeSet<&'a str> {
    services
        .iter()
        .filter(|(_, s)| s.networks.contains(network))
        .map(|(name, _)| name.as_str())
        .collect()
}

fn set<'a>(names: &[&'a str]) -> std::collections::BTreeSet<&'a str> {
    names.iter().copied().collect()
}

/// Services meet only on a network both join: the signers are on none (nginx reaches them by
/// their sockets), oauth2-proxy only with nginx, PostgreSQL only with Keel's processes, and
/// the workers never where the signers, oauth2-proxy or nginx are.
#[test]
fn the_compose_networks_keep_the_workers_away_from_the_signers() {
    let (services, declared) = stack();
    for (name, service) in &services {
        assert!(
            service.network_mode.as_deref() == Some("none") || !service.networks.is_empty(),
            "{name} names no network, so it joins compose's default with every other such service"
        );
        for network in &service.networks {
            assert!(
                declared.contains_key(network),
                "{name}: {network} is not declared"
            );
        }
    }
    let networks_of = |name: &str| -> std::collections::BTreeSet<&str> {
        let service = services
            .get(name)
            .unwrap_or_else(|| panic!("no service {name}"));
        service.networks.iter().map(String::as_str).collect()
    };

    // PostgreSQL: one network, with no way out, shared with the Keel processes that use it.
    assert_eq!(networks_of("postgres"), set(&["database"]));
    assert!(declared["database"], "the database network is internal");
    assert_eq!(
        members(&services, "database"),
        set(&[
            "postgres",
            "migrate",
            "api",
            "worker",
            "create-database-b",
            "migrate-b",
            "api-b",
            "worker-b",
        ])
    );

    // The workers: the database, the collector, a way out; nothing in front of the APIs.
    assert_eq!(
        networks_of("worker"),
        set(&["database", "otlp", "outbound"])
    );
    assert_eq!(
        networks_of("worker-b"),
        set(&["database", "otlp", "outbound-b"])
    );
    for api in ["api", "api-b"] {
        assert_eq!(
            networks_of(api),
            set(&["database", "otlp", "frontend"]),
            "{api}"
        );
    }

    // The signers: no network at all.
    let signers: Vec<&str> = services
        .iter()
        .filter(|(_, s)| s.environment.contains_key("SIGNER_LISTEN"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(signers, ["signer-a", "signer-b"]);
    for signer in &signers {
        assert_eq!(
            services[*signer].network_mode.as_deref(),
            Some("none"),
            "{signer}"
        );
        assert!(networks_of(signer).is_empty(), "{signer}");
    }

    // nginx: the APIs' frontend and oauth2-proxy's network; oauth2-proxy meets nginx only.
    assert_eq!(networks_of("nginx"), set(&["frontend", "auth"]));
    assert_eq!(networks_of("oauth2-proxy"), set(&["auth"]));
    assert_eq!(members(&services, "auth"), set(&["nginx", "oauth2-proxy"]));
    assert_eq!(
        members(&services, "frontend"),
        set(&["nginx", "api", "api-b"])
    );
    for worker in ["worker", "worker-b"] {
        for network in networks_of(worker) {
            let met = members(&services, network);
            for front in ["nginx", "oauth2-proxy", "signer-a", "signer-b"] {
                assert!(!met.contains(front), "{worker} meets {front} on {network}");
            }
        }
    }

    // Telemetry: Keel's processes reach the collector; the backends behind it (Tempo holds
    // every tenant's traces) meet the collector and Grafana only.
    assert_eq!(
        members(&services, "observability"),
        set(&["otel-collector", "prometheus", "tempo", "grafana"])
    );
    for keel in ["migrate", "api", "worker", "migrate-b", "api-b", "worker-b"] {
        assert!(networks_of(keel).contains("otlp"), "{keel} sends telemetry");
    }
    assert!(
        members(&services, "otlp")
            .iter()
            .all(|m| *m == "otel-collector" || services[*m].image.as_deref() == Some("keel:latest")),
        "{:?}",
        members(&services, "otlp")
    );
}

/// The value every use of the database password has: compose's required-variable form.
const DB_PASSWORD: &str =
    "${KEEL_DB_PASSWORD:?set KEEL_DB_PASSWORD in .env (openssl rand -hex 32)}";

/// The password of every `postgres://user:password@` URL in `text`.
fn url_passwords(text: &str) -> Vec<&str> {
    text.lines()
        .flat_map(|line| {
            line.match_indices("postgres://")
                .filter_map(move |(at, scheme)| {
                    let rest = &line[at + scheme.len()..];
                    let userinfo = &rest[..rest.find('@')?];
                    Some(userinfo.split_once(':')?.1)
                })
        })
        .collect()
}

/// No deployment file carries a database password: the compose stack takes the deployment's
/// own from .env (KEEL_DB_PASSWORD, required), PostgreSQL and every Keel service alike.
#[test]
fn the_database_password_is_the_deployments_own() {
    let (services, _) = stack();
    assert_eq!(
        services["postgres"].environment["POSTGRES_PASSWORD"],
        DB_PASSWORD
    );
    assert_eq!(
        services["create-database-b"].environment["PGPASSWORD"],
        DB_PASSWORD
    );
    let keel: Vec<(&String, &StackService)> = services
        .iter()
        .filter(|(_, s)| s.image.as_deref() == Some("keel:latest"))
        .collect();
    assert_eq!(keel.len(), 6, "migrate, api, worker and keel-b's");
    for (name, service) in keel {
        let url = &service.environment["KEEL_DATABASE_URL"];
        let database = if name.ends_with("-b") {
            "keel_b"
        } else {
            "keel"
        };
        assert_eq!(
            *url,
            format!("postgres://keel:{DB_PASSWORD}@postgres:5432/{database}"),
            "{name}"
        );
    }

    // Nowhere a password of its own: not in a URL, not in a PostgreSQL setting.
    let mut files: Vec<String> = COMPOSE_FILES.iter().map(|f| f.to_string()).collect();
    for dir in [
        "deploy/kubernetes",
        "deploy/kubernetes/migrate",
        "deploy/systemd",
    ] {
        for entry in std::fs::read_dir(path(dir)).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_file() {
                files.push(format!(
                    "{dir}/{}",
                    entry.file_name().unwrap().to_str().unwrap()
                ));
            }
        }
    }
    for file in &files {
        let text = read(file);
        for password in url_passwords(&text) {
            assert_eq!(
                password, DB_PASSWORD,
                "{file}: a database password of its own"
            );
        }
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            for key in ["POSTGRES_PASSWORD:", "PGPASSWORD:"] {
                if let Some(value) = line.trim().strip_prefix(key) {
                    assert_eq!(value.trim(), DB_PASSWORD, "{file}: {line}");
                }
            }
        }
    }

    let example = read(".env.example");
    assert!(
        example.lines().any(|l| l == "KEEL_DB_PASSWORD="),
        "{example}"
    );
}

/// The compose service of the signer that listens at `listen` (an upstream's server).
fn signer_service<'a>(
    services: &'a BTreeMap<String, StackService>,
    listen: &str,
) -> (&'a str, &'a StackService) {
    services
        .iter()
        .find(|(_, s)| s.environment.get("SIGNER_LISTEN").map(String::as_str) == Some(listen))
        .map(|(name, s)| (name.as_str(), s))
        .unwrap_or_else(|| panic!("no signer listens at {listen}"))
}

/// nginx reaches each runtime's signer on a Unix socket: the upstream is `unix:<path>`, the
/// signer listens there, and the volume that holds it is mounted by that signer and nginx
/// alone (nginx read-only: it connects, it cannot put a socket of its own there).
#[test]
fn each_signer_listens_on_a_socket_only_nginx_shares() {
    let conf = nginx("deploy/proxy/nginx.conf");
    let upstreams = upstreams(&conf);
    let (services, _) = stack();
    let routes = runtime_routes(&conf);
    assert_eq!(routes.len(), 2);
    for route in &routes {
        let server = upstreams[route.signer];
        let socket = server
            .strip_prefix("unix:")
            .unwrap_or_else(|| panic!("{}: the signer is at {server}, not a socket", route.host));
        let (name, signer) = signer_service(&services, server);
        let dir = Path::new(socket).parent().unwrap().to_str().unwrap();
        let volume = signer
            .volumes
            .iter()
            .find_map(|v| v.strip_suffix(&format!(":{dir}")))
            .unwrap_or_else(|| panic!("{name} mounts nothing at {dir}: {:?}", signer.volumes));
        assert!(
            !volume.starts_with(['.', '/', '$']),
            "{name}: {volume} is a host directory, not a volume of the two"
        );
        let mounted_by: Vec<(&str, &str)> = services
            .iter()
            .flat_map(|(n, s)| s.volumes.iter().map(move |v| (n.as_str(), v.as_str())))
            .filter(|(_, v)| v.split(':').next() == Some(volume))
            .collect();
        let ro = format!("{volume}:{dir}:ro");
        let rw = format!("{volume}:{dir}");
        assert_eq!(mounted_by, [("nginx", ro.as_str()), (name, rw.as_str())]);

        // Owner and group only; the group is the nginx image's workers' (uid and gid 101).
        let mode = &signer.environment["SIGNER_SOCKET_MODE"];
        assert_eq!(
            u32::from_str_radix(mode, 8).unwrap() & 0o007,
            0,
            "{name}: {mode}"
        );
        assert_eq!(signer.environment["SIGNER_SOCKET_GROUP"], "101", "{name}");
        // The health check asks on the socket too: the signer has no network to probe.
        assert_eq!(
            signer.healthcheck.last().map(String::as_str),
            Some("--healthcheck"),
            "{name}"
        );
    }
}

/// One nginx token: a word (quoted or not), `;`, `{` or `}`.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    End,
    Open,
    Close,
}

fn nginx_tokens(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    for line in text.lines() {
        let mut word = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            let punctuation = match c {
                ';' => Some(Token::End),
                '{' => Some(Token::Open),
                '}' => Some(Token::Close),
                _ => None,
            };
            if c.is_whitespace() || c == '#' || c == '"' || punctuation.is_some() {
                if !word.is_empty() {
                    tokens.push(Token::Word(std::mem::take(&mut word)));
                }
            } else {
                word.push(c);
            }
            match c {
                '#' => break,
                '"' => tokens.push(Token::Word(
                    chars.by_ref().take_while(|&c| c != '"').collect(),
                )),
                _ => tokens.extend(punctuation),
            }
        }
        if !word.is_empty() {
            tokens.push(Token::Word(word));
        }
    }
    tokens
}

/// One nginx directive: `name args…;` or `name args… { block }`.
#[derive(Debug)]
struct Directive {
    name: String,
    args: Vec<String>,
    block: Vec<Directive>,
}

impl Directive {
    fn all(&self, name: &'static str) -> impl Iterator<Item = &Directive> {
        self.block.iter().filter(move |d| d.name == name)
    }

    fn arg(&self, name: &'static str) -> Option<&str> {
        self.all(name).next().map(|d| d.args[0].as_str())
    }

    /// What this location sends the next hop as header `name` ("" drops the client's).
    fn header(&self, name: &str) -> Option<&str> {
        let values: Vec<&str> = self
            .all("proxy_set_header")
            .filter(|d| d.args[0].eq_ignore_ascii_case(name))
            .map(|d| d.args[1].as_str())
            .collect();
        assert!(values.len() <= 1, "{name} is set twice: {values:?}");
        values.first().copied()
    }

    /// The variable `auth_request_set` fills from the auth subrequest's header `upstream_var`.
    fn auth_variable(&self, upstream_var: &str) -> Option<&str> {
        self.all("auth_request_set")
            .find(|d| d.args[1] == upstream_var)
            .map(|d| d.args[0].as_str())
    }

    /// The upstream a `proxy_pass http://name` goes to.
    fn upstream(&self) -> Option<&str> {
        let target = self.arg("proxy_pass")?.strip_prefix("http://").unwrap();
        Some(target.split('/').next().unwrap())
    }
}

/// Parses an nginx file, expanding `include /etc/nginx/keel/X` from deploy/proxy/snippets/X
/// (where the compose override mounts them from).
fn nginx(relative: &str) -> Vec<Directive> {
    let mut tokens = nginx_tokens(&read(relative)).into_iter();
    let directives = nginx_block(&mut tokens);
    assert!(tokens.next().is_none(), "{relative}: unbalanced braces");
    directives
}

fn nginx_block(tokens: &mut impl Iterator<Item = Token>) -> Vec<Directive> {
    let mut directives = Vec::new();
    let mut words = Vec::new();
    while let Some(token) = tokens.next() {
        let mut directive = || {
            let mut words = std::mem::take(&mut words).into_iter();
            Directive {
                name: words.next().expect("a directive has a name"),
                args: words.collect(),
                block: Vec::new(),
            }
        };
        match token {
            Token::Word(word) => words.push(word),
            Token::End => {
                let d = directive();
                if d.name == "include" {
                    let snippet = d.args[0]
                        .strip_prefix("/etc/nginx/keel/")
                        .unwrap_or_else(|| panic!("{} is not in deploy/proxy/snippets", d.args[0]));
                    directives.extend(nginx(&format!("deploy/proxy/snippets/{snippet}")));
                } else {
                    directives.push(d);
                }
            }
            Token::Open => {
                let mut d = directive();
                d.block = nginx_block(tokens);
                directives.push(d);
            }
            Token::Close => break,
        }
    }
    directives
}

/// The headers a client could send to claim an identity or a credential of its own.
const FORGEABLE: [&str; 9] = [
    "X-Keel-Remote-Secret",
    "X-Keel-Actor-Id",
    "X-Keel-Org-Id",
    "X-Keel-Runtime-Id",
    "X-Keel-Project-Id",
    "X-Keel-Role",
    "X-Keel-Runtime-Token",
    "Authorization",
    "Cookie",
];

/// The proxy's view of its upstreams: name → `host:port` of its first server.
fn upstreams(conf: &[Directive]) -> BTreeMap<&str, &str> {
    conf.iter()
        .filter(|d| d.name == "upstream")
        .map(|d| (d.args[0].as_str(), d.arg("server").unwrap()))
        .collect()
}

/// A route from a host name to a Keel runtime: the tier-2 location, and its signer's upstream.
struct RuntimeRoute<'a> {
    host: &'a str,
    location: &'a Directive,
    signer: &'a str,
}

/// Every location that proxies to a Keel API (an upstream on Keel's port, 8420).
fn runtime_routes(conf: &[Directive]) -> Vec<RuntimeRoute<'_>> {
    let upstreams = upstreams(conf);
    let mut routes = Vec::new();
    for server in conf.iter().filter(|d| d.name == "server") {
        for location in server.all("location") {
            let Some(upstream) = location.upstream() else {
                continue;
            };
            if !upstreams[upstream].ends_with(":8420") {
                continue;
            }
            let auth = location.arg("auth_request").unwrap_or_else(|| {
                panic!(
                    "location {:?} reaches Keel without auth_request",
                    location.args
                )
            });
            let signer_location = server
                .all("location")
                .find(|l| l.args == ["=", auth])
                .unwrap_or_else(|| panic!("no location = {auth}"));
            assert!(
                signer_location.all("internal").next().is_some(),
                "{auth} must be internal: a client could call the signer through it"
            );
            routes.push(RuntimeRoute {
                host: server.arg("server_name").unwrap(),
                location,
                signer: signer_location.upstream().unwrap(),
            });
            assert!(
                server.arg("listen").unwrap().starts_with("127.0.0.1:"),
                "the signing tier listens on loopback only, behind tier 1"
            );
        }
    }
    routes
}

#[test]
fn the_proxy_forwards_only_identities_its_signer_made() {
    let conf = nginx("deploy/proxy/nginx.conf");
    let upstreams = upstreams(&conf);

    let routes = runtime_routes(&conf);
    assert_eq!(routes.len(), 2, "two runtimes behind one proxy");
    for route in &routes {
        let location = route.location;
        let identity = location
            .auth_variable("$upstream_http_x_keel_identity")
            .expect("X-Keel-Identity comes from the signer's answer");
        assert_eq!(location.header("X-Keel-Identity"), Some(identity));
        for name in FORGEABLE {
            assert_eq!(
                location.header(name),
                Some(""),
                "{} forwards {name}",
                route.host
            );
        }
        for header in ["User", "Email", "Preferred-Username", "Groups"] {
            let name = format!("X-Auth-Request-{header}");
            assert_eq!(
                location.header(&name),
                Some(""),
                "{} forwards {name}",
                route.host
            );
        }
        assert!(
            upstreams[route.signer].starts_with("unix:/"),
            "{}: the signer is reached on its socket",
            route.signer
        );
    }

    // Tier 1: every location that leads to a runtime asks oauth2-proxy, drops what a client
    // sent as an identity, and passes the person as oauth2-proxy named them.
    let tier1: Vec<&Directive> = conf
        .iter()
        .filter(|d| d.name == "server")
        .flat_map(|server| server.all("location"))
        .filter(|l| l.upstream() == Some("keel_signing_tier"))
        .collect();
    assert!(tier1.len() >= 2, "the browser and API locations");
    assert_eq!(upstreams["keel_signing_tier"], "127.0.0.1:8081");
    for location in tier1 {
        assert_eq!(location.arg("auth_request"), Some("/oauth2/auth"));
        assert_eq!(location.header("X-Keel-Identity"), Some(""));
        for name in FORGEABLE {
            assert_eq!(location.header(name), Some(""), "tier 1 forwards {name}");
        }
        // The groups too: the signer makes operators of the operator groups' users.
        for header in ["user", "email", "groups"] {
            let var = location
                .auth_variable(&format!("$upstream_http_x_auth_request_{header}"))
                .unwrap();
            assert_eq!(
                location.header(&format!("X-Auth-Request-{header}")),
                Some(var)
            );
        }
    }
}

#[test]
fn each_runtime_behind_the_proxy_has_its_own_audience_and_signer() {
    let conf = nginx("deploy/proxy/nginx.conf");
    let upstreams = upstreams(&conf);
    let proxy = read("deploy/proxy/docker-compose.proxy.yml");
    let (services, _) = stack();
    let service_of = |upstream: &str| upstreams[upstream].split(':').next().unwrap().to_string();
    let mut audiences = std::collections::BTreeSet::new();
    for route in runtime_routes(&conf) {
        let api = service(&proxy, &service_of(route.location.upstream().unwrap()));
        let signer = service(&proxy, signer_service(&services, upstreams[route.signer]).0);
        let audience = setting(api, "KEEL_RUNTIME_ID").unwrap();
        assert_eq!(setting(signer, "KEEL_RUNTIME_ID"), Some(audience));
        assert_eq!(
            setting(signer, "KEEL_REMOTE_JWT_SECRET"),
            setting(api, "KEEL_REMOTE_JWT_SECRET"),
            "{audience}: the signer signs with the key its runtime verifies"
        );
        assert_eq!(setting(api, "KEEL_ALLOWED_HOSTS"), Some(route.host));
        audiences.insert(audience);
    }
    assert_eq!(audiences.len(), 2, "one runtime id each: {audiences:?}");
}

/// The signing secret of the signer tests (and of the runtime in the end-to-end test).
const SECRET: &str = "5f1c0d9e2b7a4c36a8e91f0b3d2c7e6a5f1c0d9e2b7a4c36a8e91f0b3d2c7e6a";

/// The user oauth2-proxy vouched for, as nginx passes them to the signer.
const ALICE: [(&str, &str); 2] = [
    ("X-Auth-Request-User", "alice-id"),
    ("X-Auth-Request-Email", "alice@example.com"),
];

/// Where a signer listens: a loopback port, or a Unix socket as in the compose example.
enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

/// deploy/proxy/signer/signer.py on a free loopback port or a Unix socket; killed when dropped.
struct Signer {
    child: Child,
    endpoint: Endpoint,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Signer {
    async fn start(runtime_id: &str, env: &[(&str, &str)]) -> Signer {
        let port = support::free_port();
        let endpoint = Endpoint::Tcp(format!("http://127.0.0.1:{port}"));
        Signer::launch(runtime_id, &format!("127.0.0.1:{port}"), endpoint, env).await
    }

    /// With `SIGNER_LISTEN=unix:<socket>`, as nginx's upstream in the compose example.
    async fn start_on_socket(runtime_id: &str, socket: &Path, env: &[(&str, &str)]) -> Signer {
        let listen = format!("unix:{}", socket.display());
        let endpoint = Endpoint::Unix(socket.to_path_buf());
        Signer::launch(runtime_id, &listen, endpoint, env).await
    }

    async fn launch(
        runtime_id: &str,
        listen: &str,
        endpoint: Endpoint,
        env: &[(&str, &str)],
    ) -> Signer {
        let dir = tempfile::tempdir().unwrap();
        let orgs = dir.path().join("orgs.json");
        let mapping = json!({
            "alice@example.com": { "org": "acme", "project": "web", "name": "Alice" },
            "ops@example.com": { "org": "acme", "role": "operator" },
            "root@example.com": { "org": "acme", "role": "runtime_operator" },
            "@globex.example": "globex",
        });
        std::fs::write(&orgs, mapping.to_string()).unwrap();
        let child = signer_command(runtime_id, SECRET)
            .env("SIGNER_LISTEN", listen)
            .env("SIGNER_ORGS_FILE", &orgs)
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(dir.path().join("signer.log")).unwrap())
            .spawn()
            .expect("python3 runs the signer");
        let signer = Signer {
            child,
            endpoint,
            http: reqwest::Client::new(),
            _dir: dir,
        };
        wait_for(Duration::from_secs(10), "the signer to answer", || async {
            let answer = signer.request("GET", "/healthz", &[]).await;
            answer.filter(|(status, _)| *status == StatusCode::OK)
        })
        .await;
        signer
    }

    /// One request, with the status and any `X-Keel-Identity` of the answer; None when the
    /// signer cannot be reached.
    async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Option<(StatusCode, Option<String>)> {
        match &self.endpoint {
            Endpoint::Tcp(url) => {
                let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
                let mut request = self.http.request(method, format!("{url}{path}"));
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                let response = request.send().await.ok()?;
                let token = response
                    .headers()
                    .get("X-Keel-Identity")
                    .map(|v| v.to_str().unwrap().to_string());
                Some((response.status(), token))
            }
            Endpoint::Unix(socket) => http_on_socket(socket, method, path, headers).await.ok(),
        }
    }

    /// Asks as nginx's auth_request does: the client's method and path, the user's headers.
    async fn identity(
        &self,
        method: reqwest::Method,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Option<String>) {
        self.request(method.as_str(), "/v1/tasks", headers)
            .await
            .expect("the signer answers")
    }

    /// SIGTERM, as `docker compose stop` sends it, and its exit code.
    fn terminate(&mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        self.child.wait().unwrap().code()
    }
}

/// An HTTP/1.1 request on a Unix socket, as nginx sends one to `server unix:…`: the status
/// and `X-Keel-Identity` of the answer.
async fn http_on_socket(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(StatusCode, Option<String>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: a.keel.example.com\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {response:?}")))?;
    let token = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("X-Keel-Identity")
            .then(|| value.trim().to_string())
    });
    Ok((StatusCode::from_u16(status).unwrap(), token))
}

impl Drop for Signer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signer_command(runtime_id: &str, secret: &str) -> Command {
    let mut command = Command::new("python3");
    command
        .arg(path("deploy/proxy/signer/signer.py"))
        .env("KEEL_RUNTIME_ID", runtime_id)
        .env("KEEL_REMOTE_JWT_SECRET", secret)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// The claims of a signer token, verified as a runtime with id `audience` verifies them.
fn verify(token: &str, audience: &str) -> jsonwebtoken::errors::Result<Value> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "nbf", "aud", "sub"]);
    validation.validate_nbf = true;
    let key = DecodingKey::from_secret(SECRET.as_bytes()).unwrap();
    jsonwebtoken::decode::<Value>(token, &key, &validation).map(|data| data.claims)
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn the_signer_signs_a_short_lived_identity_for_its_runtime() {
    let signer = Signer::start("keel-a", &[]).await;
    let before = now();
    let (status, token) = signer.identity(reqwest::Method::POST, &ALICE).await;
    assert_eq!(status, StatusCode::OK);
    let token = token.expect("the identity is in X-Keel-Identity");

    let claims = verify(&token, "keel-a").expect("a token Keel's verification accepts");
    assert_eq!(claims["sub"], "alice-id");
    assert_eq!(claims["org"], "acme");
    assert_eq!(claims["aud"], "keel-a");
    assert_eq!(claims["project"], "web");
    assert_eq!(claims["name"], "Alice");
    assert_eq!(claims["role"], "member", "the default role, stated");
    let (iat, nbf, exp) = (
        claims["iat"].as_i64().unwrap(),
        claims["nbf"].as_i64().unwrap(),
        claims["exp"].as_i64().unwrap(),
    );
    assert!((before..=now()).contains(&iat), "iat {iat} is now");
    assert_eq!(nbf, iat);
    assert_eq!(exp - iat, 60, "one minute");
    assert!(
        exp <= now() + 300,
        "Keel refuses tokens valid for over 5 minutes"
    );

    let other_runtime = verify(&token, "keel-b").unwrap_err();
    assert_eq!(
        *other_runtime.kind(),
        jsonwebtoken::errors::ErrorKind::InvalidAudience
    );

    // A user the mapping names only by their email's domain.
    let carol = [
        ("X-Auth-Request-User", "carol"),
        ("X-Auth-Request-Email", "carol@globex.example"),
    ];
    let (status, token) = signer.identity(reqwest::Method::GET, &carol).await;
    assert_eq!(status, StatusCode::OK);
    let claims = verify(&token.unwrap(), "keel-a").unwrap();
    assert_eq!(
        (&claims["sub"], &claims["org"]),
        (&json!("carol"), &json!("globex"))
    );
    assert_eq!(claims["name"], "carol@globex.example");
    assert!(claims.get("project").is_none());
}

#[tokio::test]
async fn the_signer_refuses_a_request_without_a_user_or_an_org() {
    let signer = Signer::start("keel-a", &[]).await;
    let (status, token) = signer.identity(reqwest::Method::GET, &[]).await;
    assert_eq!((status, token), (StatusCode::UNAUTHORIZED, None));
    let (status, token) = signer
        .identity(
            reqwest::Method::GET,
            &[("X-Auth-Request-Email", "alice@example.com")],
        )
        .await;
    assert_eq!((status, token), (StatusCode::UNAUTHORIZED, None), "no user");
    let stranger = [
        ("X-Auth-Request-User", "mallory"),
        ("X-Auth-Request-Email", "mallory@elsewhere.example"),
    ];
    let (status, token) = signer.identity(reqwest::Method::GET, &stranger).await;
    assert_eq!((status, token), (StatusCode::FORBIDDEN, None), "no org");

    // With a default org, everyone oauth2-proxy admitted gets one.
    let open = Signer::start("keel-a", &[("SIGNER_DEFAULT_ORG", "everyone")]).await;
    let (status, token) = open.identity(reqwest::Method::GET, &stranger).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        verify(&token.unwrap(), "keel-a").unwrap()["org"],
        "everyone"
    );
}

/// The role claim: `operator` from the mapping's `role` or from an operator group in the
/// groups header nginx passes (oauth2-proxy's `X-Auth-Request-Groups`), else `member`.
#[tokio::test]
async fn the_signer_makes_operators_only_of_the_mapping_and_the_operator_groups() {
    let signer = Signer::start("keel-a", &[("SIGNER_OPERATOR_GROUPS", "keel-ops, sre")]).await;
    let role = |headers: Vec<(&'static str, &'static str)>| {
        let signer = &signer;
        async move {
            let (status, token) = signer.identity(reqwest::Method::GET, &headers).await;
            assert_eq!(status, StatusCode::OK);
            verify(&token.unwrap(), "keel-a").unwrap()["role"].clone()
        }
    };
    let carol = |groups: &'static str| {
        vec![
            ("X-Auth-Request-User", "carol"),
            ("X-Auth-Request-Email", "carol@globex.example"),
            ("X-Auth-Request-Groups", groups),
        ]
    };
    assert_eq!(role(ALICE.to_vec()).await, "member");
    let ops = vec![
        ("X-Auth-Request-User", "ops"),
        ("X-Auth-Request-Email", "ops@example.com"),
    ];
    assert_eq!(role(ops).await, "operator", "the mapping's role");
    assert_eq!(role(carol("staff,keel-ops")).await, "operator");
    assert_eq!(role(carol("sre")).await, "operator");
    for not_operator in ["staff", "keel-ops-readers", "keel", ""] {
        assert_eq!(role(carol(not_operator)).await, "member", "{not_operator}");
    }
    // Without operator groups, no group makes an operator.
    let plain = Signer::start("keel-a", &[]).await;
    let (_, token) = plain
        .identity(reqwest::Method::GET, &carol("keel-ops"))
        .await;
    assert_eq!(verify(&token.unwrap(), "keel-a").unwrap()["role"], "member");
}

/// The deployment's own operator: `runtime_operator` from the mapping's `role` or from a
/// runtime operator group, above any operator group the user is also in; no operator group
/// makes one.
#[tokio::test]
async fn the_signer_marks_the_runtime_operator_only_from_the_mapping_and_its_groups() {
    let groups = [
        ("SIGNER_OPERATOR_GROUPS", "keel-ops"),
        ("SIGNER_RUNTIME_OPERATOR_GROUPS", "platform"),
    ];
    let signer = Signer::start("keel-a", &groups).await;
    let role = |headers: Vec<(&'static str, &'static str)>| {
        let signer = &signer;
        async move {
            let (status, token) = signer.identity(reqwest::Method::GET, &headers).await;
            assert_eq!(status, StatusCode::OK);
            verify(&token.unwrap(), "keel-a").unwrap()["role"].clone()
        }
    };
    let carol = |groups: &'static str| {
        vec![
            ("X-Auth-Request-User", "carol"),
            ("X-Auth-Request-Email", "carol@globex.example"),
            ("X-Auth-Request-Groups", groups),
        ]
    };
    let root = vec![
        ("X-Auth-Request-User", "root"),
        ("X-Auth-Request-Email", "root@example.com"),
    ];
    assert_eq!(role(root).await, "runtime_operator", "the mapping's role");
    assert_eq!(role(carol("keel-ops,platform")).await, "runtime_operator");
    assert_eq!(role(carol("keel-ops")).await, "operator");
    assert_eq!(role(carol("platform-readers")).await, "member");
    // Without runtime operator groups, no group makes one.
    let plain = Signer::start("keel-a", &[("SIGNER_OPERATOR_GROUPS", "platform")]).await;
    let (_, token) = plain
        .identity(reqwest::Method::GET, &carol("platform"))
        .await;
    let claims = verify(&token.unwrap(), "keel-a").unwrap();
    assert_eq!(claims["role"], "operator");
}

#[test]
fn the_signer_refuses_a_mapping_with_an_unknown_role() {
    let dir = tempfile::tempdir().unwrap();
    let orgs = dir.path().join("orgs.json");
    std::fs::write(
        &orgs,
        json!({ "eve@example.com": { "org": "acme", "role": "admin" } }).to_string(),
    )
    .unwrap();
    let refused = signer_command("keel-a", SECRET)
        .env("SIGNER_ORGS_FILE", &orgs)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("'admin'"));
}

#[test]
fn the_signer_refuses_to_start_with_a_weak_secret_or_a_long_lifetime() {
    let weak = signer_command("keel-a", "short").output().unwrap();
    assert_eq!(weak.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&weak.stderr).contains("at least 32 characters"));
    let long = signer_command("keel-a", SECRET)
        .env("SIGNER_TTL_SECONDS", "301")
        .output()
        .unwrap();
    assert_eq!(long.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&long.stderr).contains("SIGNER_TTL_SECONDS"));
}

#[tokio::test]
async fn a_remote_runtime_accepts_the_signers_identity_and_nothing_else() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(
        &db,
        logs.path(),
        "api",
        &[
            ("KEEL_REMOTE_MODE", "1"),
            ("KEEL_RUNTIME_ID", "keel-e2e"),
            ("KEEL_REMOTE_JWT_SECRET", SECRET),
        ],
    )
    .await;
    let client = api.client.clone().unwrap();
    let whoami = |identity: Option<&str>, headers: &[(&str, &str)]| {
        let mut request = client.http.get(format!("{}/v1/whoami", client.base));
        if let Some(token) = identity {
            request = request.header("X-Keel-Identity", token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        client.send(request)
    };

    let signer = Signer::start("keel-e2e", &[]).await;
    let (_, token) = signer.identity(reqwest::Method::GET, &ALICE).await;
    let (status, body) = whoami(token.as_deref(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session: Session = support::record(&body);
    assert_eq!(
        session.runtime_host.runtime_mode,
        RuntimeMode::Remote,
        "{body}"
    );
    let identity = session.remote_identity.as_ref().unwrap();
    assert_eq!(identity.actor_id, "alice-id", "{body}");
    assert_eq!(identity.org_id, "acme", "{body}");
    assert_eq!(identity.runtime_id, "keel-e2e", "{body}");
    assert_eq!(identity.project_id.as_deref(), Some("web"), "{body}");
    assert_eq!(identity.name.as_deref(), Some("Alice"), "{body}");
    assert_eq!(session.role, "member", "{body}");
    // The mapping's operator is an operator to the runtime.
    let ops = [
        ("X-Auth-Request-User", "ops"),
        ("X-Auth-Request-Email", "ops@example.com"),
    ];
    let (_, token) = signer.identity(reqwest::Method::GET, &ops).await;
    let (status, body) = whoami(token.as_deref(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(support::record::<Session>(&body).role, "operator", "{body}");
    // And the mapping's runtime operator is the deployment's own.
    let root = [
        ("X-Auth-Request-User", "root"),
        ("X-Auth-Request-Email", "root@example.com"),
    ];
    let (_, token) = signer.identity(reqwest::Method::GET, &root).await;
    let (status, body) = whoami(token.as_deref(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let role = support::record::<Session>(&body).role;
    assert_eq!(role, "runtime_operator", "{body}");

    let (status, body) = whoami(None, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["type"], "unauthorized", "{body}");
    // What nginx drops: identity headers a client made up are no identity.
    let forged = [
        ("X-Keel-Actor-Id", "alice-id"),
        ("X-Keel-Org-Id", "acme"),
        ("X-Keel-Runtime-Id", "keel-e2e"),
    ];
    let (status, body) = whoami(None, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // A token another runtime's signer made (same secret, other audience).
    let other = Signer::start("keel-other", &[]).await;
    let (_, token) = other.identity(reqwest::Method::GET, &ALICE).await;
    let (status, body) = whoami(token.as_deref(), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}

/// The inodes of the sockets process `pid` holds open.
fn socket_inodes(pid: u32) -> std::collections::BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.strip_prefix("socket:[")?;
            target.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The inodes of the sockets in /proc/`pid`/net/`table` (tcp, tcp6, udp, udp6: column 10;
/// unix: column 7), with the rest of each line.
fn net_table(pid: u32, table: &str) -> Vec<(u64, String)> {
    let column = if table == "unix" { 6 } else { 9 };
    std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let inode = line.split_whitespace().nth(column)?.parse().ok()?;
            Some((inode, line.to_string()))
        })
        .collect()
}

/// The compose example's signer: on a Unix socket and nowhere else. nginx's request (HTTP
/// on the socket) gets an identity; the process holds no TCP or UDP socket, so whatever
/// cannot open the socket (its directory, and the socket's mode 0660 and group) has nothing
/// to connect to, on loopback or any other address.
#[tokio::test]
async fn the_signer_on_a_unix_socket_answers_there_and_nowhere_else() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("signer.sock");
    // A group this test's process is in: the one its own new directory got.
    let gid = std::fs::metadata(dir.path()).unwrap().gid();
    let group = gid.to_string();
    let mut signer =
        Signer::start_on_socket("keel-a", &socket, &[("SIGNER_SOCKET_GROUP", &group)]).await;

    let (status, token) = signer.identity(reqwest::Method::GET, &ALICE).await;
    assert_eq!(status, StatusCode::OK);
    let claims = verify(&token.unwrap(), "keel-a").unwrap();
    assert_eq!(
        (&claims["sub"], &claims["org"]),
        (&json!("alice-id"), &json!("acme"))
    );
    let (status, token) = signer.identity(reqwest::Method::GET, &[]).await;
    assert_eq!((status, token), (StatusCode::UNAUTHORIZED, None));

    let file = std::fs::symlink_metadata(&socket).unwrap();
    assert!(file.file_type().is_socket());
    assert_eq!(file.mode() & 0o777, 0o660, "the owner and the group only");
    assert_eq!(file.gid(), gid);

    // No other way in: every socket the process holds is a Unix one, its listener this path.
    let pid = signer.child.id();
    let held = socket_inodes(pid);
    assert!(!held.is_empty());
    for table in ["tcp", "tcp6", "udp", "udp6"] {
        for (inode, line) in net_table(pid, table) {
            assert!(
                !held.contains(&inode),
                "the signer holds a {table} socket: {line}"
            );
        }
    }
    let listening: Vec<String> = net_table(pid, "unix")
        .into_iter()
        .filter(|(inode, _)| held.contains(inode))
        .map(|(_, line)| line)
        .collect();
    assert!(
        listening
            .iter()
            .any(|l| l.ends_with(socket.to_str().unwrap())),
        "{listening:?}"
    );

    // The compose health check asks on the socket.
    let listen = format!("unix:{}", socket.display());
    let healthcheck = || {
        signer_command("keel-a", SECRET)
            .env("SIGNER_LISTEN", &listen)
            .arg("--healthcheck")
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(healthcheck(), Some(0));
    // Stopped (docker compose stop), it removes its socket: nothing answers there any more.
    assert_eq!(signer.terminate(), Some(0));
    assert!(
        std::fs::symlink_metadata(&socket).is_err(),
        "the socket is left"
    );
    assert_eq!(healthcheck(), Some(1));
}

/// A killed signer (a container's restart) leaves its socket behind: the next one replaces
/// it, but never a socket a live signer listens on, nor a file that is not a socket.
#[tokio::test]
async fn the_signer_replaces_a_stale_socket_and_nothing_else() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("signer.sock");
    let listen = format!("unix:{}", socket.display());
    let start_beside = || {
        signer_command("keel-a", SECRET)
            .env("SIGNER_LISTEN", &listen)
            .output()
            .unwrap()
    };

    let mut first = Signer::start_on_socket("keel-a", &socket, &[]).await;
    let busy = start_beside();
    assert_eq!(busy.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("another process is listening"));
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let stale = std::fs::symlink_metadata(&socket).unwrap();
    assert!(stale.file_type().is_socket(), "a stale socket");

    let second = Signer::start_on_socket("keel-a", &socket, &[]).await;
    let (status, _) = second.identity(reqwest::Method::GET, &ALICE).await;
    assert_eq!(status, StatusCode::OK);
    drop(second);

    std::fs::remove_file(&socket).unwrap();
    std::fs::write(&socket, "not a socket").unwrap();
    let refused = start_beside();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not a socket"));
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
}
