//! The metrics endpoint when the process runs out of file descriptors: it must not spin on
//! `accept`, must count what it could not accept, and must answer probes again afterwards.
//!
//! Alone in its file, so that lowering this test process's RLIMIT_NOFILE touches nothing else.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use observer::metrics::{self, Metrics};

/// CPU time (user + system) this process has used so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc is mounted")
        .count() as u64
}

fn descriptor_limit() -> u64 {
    // SAFETY: getrlimit fills the struct it is given.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur
    }
}

fn set_descriptor_limit(soft: u64) {
    // SAFETY: getrlimit/setrlimit on this process's own limits.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

#[test]
fn out_of_descriptors_the_endpoint_backs_off_and_recovers() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(metrics::bind("127.0.0.1:0"))
        .expect("bind a loopback port");
    let addr = listener.local_addr().unwrap();
    let shared = Arc::new(Mutex::new(Metrics::default()));
    let server = runtime.spawn(metrics::serve(listener, Arc::clone(&shared)));
    let runtime_thread = std::thread::spawn(move || {
        runtime.block_on(async {
            let _ = server.await;
        })
    });
    assert!(
        get(addr, "/healthz")
            .unwrap()
            .starts_with("HTTP/1.1 200 OK")
    );

    // Idle connections until no descriptor is left: each costs one here and one in the server,
    // which holds it while it waits for a request, so the last ones stay in the backlog.
    let saved_limit = descriptor_limit();
    set_descriptor_limit(open_descriptors() + 24);
    let mut idle = Vec::new();
    while idle.len() < 200 {
        match TcpStream::connect(addr) {
            Ok(stream) => idle.push(stream),
            Err(error) => {
                assert_eq!(error.raw_os_error(), Some(libc::EMFILE), "{error}");
                break;
            }
        }
    }
    assert!(idle.len() < 200, "the descriptor limit was never reached");

    // Exhausted for a while: an `accept` retried without pause would burn the whole window.
    let window = Duration::from_millis(1500);
    let (cpu_before, started) = (cpu_time(), Instant::now());
    std::thread::sleep(window);
    let busy = cpu_time() - cpu_before;
    let elapsed = started.elapsed();
    assert!(
        busy < elapsed / 4,
        "the server spun: {busy:?} of CPU in {elapsed:?}"
    );

    drop(idle);
    set_descriptor_limit(saved_limit);
    let deadline = Instant::now() + Duration::from_secs(10);
    let health = loop {
        match get(addr, "/healthz") {
            Ok(response) if response.starts_with("HTTP/1.1 200 OK") => break response,
            other if Instant::now() > deadline => {
                panic!("/healthz never answered again: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(health.ends_with("ok\n"), "{health}");
    let text = get(addr, "/metrics").unwrap();
    let errors: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("openim_observer_metrics_accept_errors_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no accept error counter: {text}"));
    assert!(errors > 0, "{text}");
    drop(runtime_thread);
}
