//! Exports the standard `process_*` series every Prometheus client exports, read from `/proc/self`
//! at each scrape.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Exports `process_*` for this process: CPU time, memory, descriptors and start time.
#[derive(Debug, Default)]
pub struct ProcessMetrics;

/// Holds what `/proc/self/stat` and `/proc/stat` say of this process.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    start_time_seconds: f64,
    virtual_memory_bytes: f64,
    resident_memory_bytes: f64,
}

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(stat) = read_stat() {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            for (name, help, value) in [
                (
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    stat.start_time_seconds,
                ),
                (
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes",
                    stat.virtual_memory_bytes,
                ),
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes",
                    stat.resident_memory_bytes,
                ),
            ] {
                gauge(&mut encoder, name, help, value)?;
            }
        }
        if let Ok(descriptors) = std::fs::read_dir("/proc/self/fd") {
            let open = descriptors.count() as f64;
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                open,
            )?;
        }
        if let Some(max) = max_fds() {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max,
            )?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

/// Reads `/proc/self/stat`, with `/proc/stat`'s boot time for the start time.
fn read_stat() -> Option<Stat> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    parse_stat(&stat, &boot, ticks as f64, page as f64)
}

/// Parses `/proc/self/stat` (`stat`) and `/proc/stat` (`boot`) with the clock's ticks a
/// second and the page size.
fn parse_stat(stat: &str, boot: &str, ticks: f64, page: f64) -> Option<Stat> {
    // The command name is in parentheses and may hold spaces: fields are counted after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name, field 3 (state) is index 0: utime is field 14, stime 15, starttime 22,
    // vsize 23, rss 24.
    let field = |number: usize| -> Option<f64> { fields.get(number - 3)?.parse().ok() };
    let boot_time: f64 = boot
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    if ticks <= 0.0 {
        return None;
    }
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) / ticks,
        start_time_seconds: boot_time + field(22)? / ticks,
        virtual_memory_bytes: field(23)?,
        resident_memory_bytes: field(24)? * page,
    })
}

/// Returns the soft limit on open descriptors (`Max open files` in `/proc/self/limits`).
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests;
