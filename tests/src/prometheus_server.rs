//! Runs a real Prometheus server (Debian's `prometheus` package; `cargo xtask test` and `.ci/run`
//! install it) for the metrics tests: started on a free loopback port with a temporary
//! configuration and storage directory, scraping the targets given every second, and killed and
//! removed when dropped. Also runs `promtool`.
//!
//! Included by the test files that use it (`#[path]`), not by the crate.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Bounds how long a started server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Holds a running Prometheus.
pub struct PrometheusServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

/// Says whether `program` (`prometheus`, `promtool`) can be run; when not, says why on stderr so a
/// skipped test is visible.
pub fn available(program: &str) -> bool {
    let runs = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !runs {
        eprintln!(
            "skipped: no {program} (install Debian's prometheus package, as `cargo xtask test` \
            does)"
        );
    }
    runs
}

/// Runs `promtool ARGS…` in `dir`.
///
/// # Errors
///
/// Fails when `promtool` cannot be run.
pub fn promtool(dir: &Path, args: &[&str]) -> Result<Output> {
    Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running promtool")
}

impl PrometheusServer {
    /// Starts Prometheus scraping `job`'s `targets` (`host:port`) every second, evaluating the
    /// `rules` (a rules file's text, if any) every second.
    ///
    /// # Errors
    ///
    /// Fails when no free port is found, the directory, rules or configuration cannot be written,
    /// `prometheus` does not start, or it does not become ready.
    pub fn start(job: &str, targets: &[&str], rules: Option<&str>) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "openim-lab-prometheus-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let targets = targets
            .iter()
            .map(|target| format!("'{target}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: '{job}'\n    static_configs:\n      - targets: [{targets}]\n"
        );
        if let Some(rules) = rules {
            std::fs::write(dir.join("rules.yaml"), rules).context("writing the rules")?;
            config.push_str("rule_files:\n  - rules.yaml\n");
        }
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).context("writing prometheus.yml")?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log")).context("creating the log")?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("could not start prometheus (install it: apt-get install prometheus)")?;
        let mut server = Self {
            child: Some(child),
            port,
            dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!("prometheus exited with {status}: {}", self.log().trim());
            }
            if self.get("/-/ready").is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "prometheus was not ready within {READY_TIMEOUT:?}: {}",
            self.log()
        )
    }

    /// Waits until `job`'s targets have been scraped successfully: Prometheus hands targets
    /// to its scrapers a few seconds after start, so earlier samples would be missed.
    ///
    /// # Errors
    ///
    /// Fails when the targets are not scraped within 30 s.
    pub fn wait_for_targets(&self, job: &str) -> Result<()> {
        let started = Instant::now();
        let query = format!("up{{job=\"{job}\"}} == 1");
        while started.elapsed() < READY_TIMEOUT {
            let data = self.query(&query)?;
            if data["result"]
                .as_array()
                .is_some_and(|result| !result.is_empty())
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "{job} was not scraped within {READY_TIMEOUT:?}: {}",
            self.log()
        )
    }

    /// Returns Prometheus' own log (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// Sends `GET path` (with its query string, already encoded) and returns the status and the
    /// body.
    ///
    /// # Errors
    ///
    /// Fails when Prometheus cannot be reached or read from, or its response has no head or status.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        // HTTP/1.0: the body ends with the connection, never chunked.
        write!(stream, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .context("a response without a head")?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .context("a response without a status")?;
        Ok((status, body.to_owned()))
    }

    /// Returns an API call's `data`, failing unless Prometheus answers `status: success`.
    ///
    /// # Errors
    ///
    /// Fails when the request fails, the body is not JSON, or the status is not `success`.
    pub fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = self.get(path)?;
        let answer: Value =
            serde_json::from_str(&body).with_context(|| format!("{path}: not JSON: {body}"))?;
        if status != 200 || answer["status"] != "success" {
            bail!("{path}: {status} {body}");
        }
        Ok(answer["data"].clone())
    }

    /// Evaluates an instant query (`/api/v1/query`), failing on any error Prometheus reports.
    ///
    /// # Errors
    ///
    /// Fails as [`PrometheusServer::api`] does.
    pub fn query(&self, expr: &str) -> Result<Value> {
        self.api(&format!("/api/v1/query?query={}", encode_query(expr)))
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter's value (RFC 3986 unreserved characters kept).
pub fn encode_query(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len() * 3);
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}
