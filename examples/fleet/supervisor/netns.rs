//! `--netns`: the whole fleet in a network namespace of its own, and `--partition-rate`'s
//! nftables rules inside it.
//!
//! The supervisor the user started (the outer one) creates a fresh namespace
//! `dma-fleet-<its pid>`, brings its loopback up (127.0.0.0/8 only: a fresh namespace has no
//! other interface), lowers tcp's retransmission limit there when asked (`--tcp-retries2`,
//! a per-namespace sysctl), loads one nftables table, and runs itself again inside
//! (`ip netns exec`, with `--inside-netns`): that inner supervisor runs the fleet. The outer one
//! waits for it and removes the namespace on every exit path (a drop guard: normal exit, error,
//! panic; Ctrl-C reaches both, and the inner one stops its children first). A namespace left by a
//! supervisor killed with SIGKILL is removed by the next run (its pid is gone).
//!
//! The table drops every packet from or to the addresses in its set `cut`, in both the input
//! and the output hook; each client has an address of its own in the namespace
//! ([`protocol::client_host`](crate::protocol::client_host)), so adding it to the set cuts that
//! client off both ways, its fabric connections and its control connection alike, and removing it
//! heals the partition.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::{Flags, Result, signals};

/// The namespaces' names, before the outer supervisor's pid.
const PREFIX: &str = "dma-fleet-";

/// The table loaded into every fleet namespace.
const RULES: &str = "table inet fleet {
    set cut { type ipv4_addr; }
    chain input { type filter hook input priority 0; policy accept; ip saddr @cut drop; ip daddr @cut drop; }
    chain output { type filter hook output priority 0; policy accept; ip saddr @cut drop; ip daddr @cut drop; }
}
";

/// Run `program` with `args`; an error with its stderr when it fails.
fn run(program: &str, args: &[&str], input: Option<&str>) -> Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("{program}: {error} (is it installed? scripts/lib/setup.sh)"))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        return Err(format!(
            "{program} {}: {} {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// Remove the namespaces of outer supervisors that are gone.
fn sweep() {
    let Ok(listed) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name], None);
        }
    }
}

/// A namespace this process created; dropping it removes it.
struct Namespace {
    name: String,
}

impl Namespace {
    fn create(tcp_retries2: Option<u32>) -> Result<Self> {
        let name = format!("{PREFIX}{}", std::process::id());
        run("ip", &["netns", "add", &name], None)?;
        let namespace = Self { name };
        let name = namespace.name.as_str();
        run(
            "ip",
            &["netns", "exec", name, "ip", "link", "set", "lo", "up"],
            None,
        )?;
        if let Some(retries) = tcp_retries2 {
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    name,
                    "sysctl",
                    "-q",
                    "-w",
                    &format!("net.ipv4.tcp_retries2={retries}"),
                ],
                None,
            )?;
        }
        run(
            "ip",
            &["netns", "exec", name, "nft", "-f", "-"],
            Some(RULES),
        )?;
        Ok(namespace)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(error) = run("ip", &["netns", "del", &self.name], None) {
            eprintln!("fleet: removing namespace {}: {error}", self.name);
        }
    }
}

/// Whether this process runs as root.
fn root() -> bool {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    0 == unsafe { geteuid() }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// The outer supervisor: check the flags, create the namespace, run the fleet inside it, remove
/// the namespace. `Ok(true)` when the inner supervisor exited 0.
pub fn run_outside(flags: &Flags) -> Result<bool> {
    if !flags.netns {
        return Err(
            "--partition-rate needs --netns (partitions are nftables rules inside the \
                    fleet's own network namespace)"
                .into(),
        );
    }
    if !root() {
        return Err(
            "--netns (and --partition-rate, which needs it) must run as root: it creates a \
             network namespace and nftables rules; run with sudo, or leave both out"
                .into(),
        );
    }
    signals::catch_interrupts()?;
    sweep();
    let namespace = Namespace::create(flags.tcp_retries2)?;
    let mut inner = Command::new("ip")
        .args(["netns", "exec", &namespace.name])
        .arg(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .arg("--inside-netns")
        .args(["--supervisor-pid", &std::process::id().to_string()])
        .spawn()?;
    let status = loop {
        if let Some(status) = inner.try_wait()? {
            break status;
        }
        if signals::interrupted() {
            // Ctrl-C from a terminal reached the inner supervisor too; a SIGTERM sent to this
            // process alone did not: pass it on (a second request is harmless).
            let _ = signals::send(inner.id(), signals::SIGTERM);
            break inner.wait()?;
        }
        thread::sleep(Duration::from_millis(20));
    };
    drop(namespace);
    if signals::interrupted() {
        return Err("interrupted".into());
    }
    Ok(status.success())
}

/// Inside the namespace: drop every packet from or to `host`.
pub fn cut(host: Ipv4Addr) -> Result<()> {
    run(
        "nft",
        &[
            "add",
            "element",
            "inet",
            "fleet",
            "cut",
            &format!("{{ {host} }}"),
        ],
        None,
    )
}

/// Inside the namespace: let `host`'s packets through again.
pub fn heal(host: Ipv4Addr) -> Result<()> {
    run(
        "nft",
        &[
            "delete",
            "element",
            "inet",
            "fleet",
            "cut",
            &format!("{{ {host} }}"),
        ],
        None,
    )
}
