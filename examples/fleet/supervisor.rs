//! The supervisor: spawns the server and the clients, injects the faults, stops everything in
//! order, prints the report and decides the exit status.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::protocol::{self, Random};
use crate::{Flags, Result, signals};

mod netns;
mod report;

/// How long the server and the clients may take to start.
const START_PATIENCE: Duration = Duration::from_secs(30);
/// How long the clients may take to exit once asked.
const CLIENT_EXIT_PATIENCE: Duration = Duration::from_secs(15);
/// How long the server may take to exit once asked.
const SERVER_EXIT_PATIENCE: Duration = Duration::from_secs(20);
/// After a SIGKILL, how long the fault counts as going on for the other clients, at least (and
/// until a quarter second after the new incarnation announced itself).
const KILL_WINDOW: Duration = Duration::from_secs(1);
/// The supervisor's loop period.
const TICK: Duration = Duration::from_millis(5);

/// The scratch directory's name, before the supervisor's pid.
const SCRATCH_PREFIX: &str = "dma-libfabric-fleet-";

/// Remove the scratch directories of supervisors that are gone (one killed with SIGKILL could not
/// remove its own).
fn sweep_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(SCRATCH_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Who printed a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Server,
    Client { id: u32, incarnation: u32 },
}

/// A child's stdout line, forwarded by its reader thread.
type Line = (Who, String);

/// One client id's current process.
struct ClientProcess {
    incarnation: u32,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// `Some(until)` while SIGSTOPped.
    stopped_until: Option<Instant>,
    port: Option<u16>,
    /// With --reuse-ports: the predecessor's port this incarnation was asked to bind.
    asked_port: Option<u16>,
    ready: bool,
    /// `Some(until)` while partitioned (`Some(None)`: for good, until the run ends).
    cut_until: Option<Option<Instant>>,
    /// This incarnation was partitioned at some time (so it may lose its connections).
    was_cut: bool,
    /// The open fault window of this client, an index into `Fleet::windows`.
    window: Option<usize>,
}

/// A period during which client `client` was faulty, in [`protocol::unix_nanos`].
#[derive(Debug, Clone, Copy)]
struct Window {
    client: u32,
    start: u64,
    end: Option<u64>,
    /// A kill's window lasts until the new incarnation is ready (and at least `KILL_WINDOW`).
    kill: bool,
    /// A partition's window (else a stop's, when not a kill).
    partition: bool,
}

/// The processes and what happened to them. Dropping it kills (SIGKILL, which reaches stopped
/// processes too) and reaps every child still running and removes the scratch directory: the
/// cleanup on every exit path, a panic included.
struct Fleet {
    executable: PathBuf,
    supervisor_pid: i32,
    scratch: PathBuf,
    server: Option<Child>,
    server_stdin: Option<ChildStdin>,
    server_port: u16,
    clients: Vec<ClientProcess>,
    lines: Sender<Line>,
    windows: Vec<Window>,
    reuse_ports: bool,
    provider: crate::FleetProvider,
    write_deadline: f64,
    inside_netns: bool,
    partitions: u64,
    /// Of the partitions, those for good (until the run ends).
    partitions_for_good: u64,
    /// Partitioned clients that lost their connections (exited for a new incarnation).
    lost_to_partition: u64,
    started: u64,
    killed: u64,
    stopped: u64,
    reuse_attempts: u64,
    reused: u64,
    unexpected_exits: Vec<String>,
    /// Of the SIGKILLs, those that hit a stopped client.
    killed_stopped: u64,
    /// Faults due when no client was eligible (all stopped or starting): skipped.
    skipped: u64,
    /// (id, incarnation, when) of each SIGKILL.
    kills: Vec<(u32, u32, u64)>,
    /// (id, incarnation, when) of each partition.
    cuts: Vec<(u32, u32, u64)>,
    /// When the run's faults ended and shutdown began ([`protocol::unix_nanos`]).
    shutdown_at: u64,
    /// The server's `FLEET-TOTALS` line.
    totals: Option<String>,
    /// The server's `FLEET-ERRORS` line.
    errors: Option<String>,
    /// The server's `FLEET-DEPARTURE` lines.
    departures: Vec<String>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for client in &mut self.clients {
            client.stdin.take();
            if let Some(mut child) = client.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.server_stdin.take();
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Forward `stdout`'s lines to `lines`, as `who`.
fn forward(who: Who, stdout: impl std::io::Read + Send + 'static, lines: Sender<Line>) {
    let spawned = thread::Builder::new()
        .name("child-stdout".into())
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines.send((who, line)).is_err() {
                    break;
                }
            }
        });
    if let Err(error) = spawned {
        eprintln!("fleet: no thread to read a child's output: {error}");
    }
}

impl Fleet {
    fn command(&self, role: &str) -> Command {
        let mut command = Command::new(&self.executable);
        command
            .args(["--role", role])
            .args(["--supervisor-pid", &self.supervisor_pid.to_string()])
            .args(["--provider", self.provider.flag()])
            .args(["--write-deadline", &self.write_deadline.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // A process group of its own: the terminal's Ctrl-C reaches the supervisor alone,
            // which then stops the children itself.
            .process_group(0);
        if self.inside_netns {
            command.arg("--inside-netns");
        }
        command
    }

    fn spawn_server(&mut self, clients: u32) -> Result<()> {
        let mut command = self.command("server");
        command
            .args(["--clients", &clients.to_string()])
            .arg("--samples")
            .arg(self.scratch.join("samples"));
        let mut child = command.spawn()?;
        self.server_stdin = child.stdin.take();
        if let Some(stdout) = child.stdout.take() {
            forward(Who::Server, stdout, self.lines.clone());
        }
        self.server = Some(child);
        Ok(())
    }

    /// Start incarnation `incarnation` of client `id`; with `port`, ask tcp to bind it.
    fn spawn_client(&mut self, id: u32, incarnation: u32, port: Option<u16>) -> Result<()> {
        let mut command = self.command("client");
        command
            .args(["--id", &id.to_string()])
            .args(["--incarnation", &incarnation.to_string()])
            .args(["--server-port", &self.server_port.to_string()]);
        if let Some(port) = port {
            command
                .env("FI_TCP_PORT_LOW_RANGE", port.to_string())
                .env("FI_TCP_PORT_HIGH_RANGE", port.to_string());
            self.reuse_attempts += 1;
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take();
        if let Some(stdout) = child.stdout.take() {
            forward(Who::Client { id, incarnation }, stdout, self.lines.clone());
        }
        let process = ClientProcess {
            incarnation,
            child: Some(child),
            stdin,
            stopped_until: None,
            port: None,
            asked_port: port,
            ready: false,
            cut_until: None,
            was_cut: false,
            window: None,
        };
        match self.clients.get_mut(id as usize) {
            Some(slot) => *slot = process,
            None => self.clients.push(process),
        }
        self.started += 1;
        Ok(())
    }

    /// A random client that is ready (not starting), and with `running`, not stopped either.
    fn pick(&self, random: &mut Random, running: bool) -> Option<u32> {
        let candidates: Vec<u32> = (0..self.clients.len() as u32)
            .filter(|&id| {
                let client = &self.clients[id as usize];
                client.ready
                    && client.child.is_some()
                    && (!running || (client.stopped_until.is_none() && client.cut_until.is_none()))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        Some(candidates[random.below(candidates.len() as u64) as usize])
    }

    fn kill_and_restart(&mut self, id: u32) -> Result<()> {
        let client = &mut self.clients[id as usize];
        let Some(mut child) = client.child.take() else {
            return Ok(());
        };
        let now = protocol::unix_nanos();
        child.kill()?;
        child.wait()?;
        self.killed += 1;
        if client.stopped_until.take().is_some() {
            // Killed while stopped: its stop ends here.
            self.killed_stopped += 1;
            if let Some(window) = client.window.take() {
                self.windows[window].end = Some(now);
            }
        }
        if client.cut_until.take().is_some() {
            // Killed while cut off: the new incarnation starts on a healed network.
            netns::heal(protocol::client_host(true, id))?;
            if let Some(window) = client.window.take() {
                self.windows[window].end = Some(now);
            }
        }
        self.kills.push((id, client.incarnation, now));
        self.windows.push(Window {
            client: id,
            start: now,
            end: None,
            kill: true,
            partition: false,
        });
        let window = self.windows.len() - 1;
        let incarnation = client.incarnation + 1;
        let port = if self.reuse_ports { client.port } else { None };
        self.spawn_client(id, incarnation, port)?;
        self.clients[id as usize].window = Some(window);
        Ok(())
    }

    fn stop(&mut self, id: u32, until: Instant) -> Result<()> {
        let client = &mut self.clients[id as usize];
        let Some(child) = &client.child else {
            return Ok(());
        };
        signals::send(child.id(), signals::SIGSTOP)?;
        client.stopped_until = Some(until);
        self.stopped += 1;
        self.windows.push(Window {
            client: id,
            start: protocol::unix_nanos(),
            end: None,
            kill: false,
            partition: false,
        });
        client.window = Some(self.windows.len() - 1);
        Ok(())
    }

    fn resume(&mut self, id: u32) -> Result<()> {
        let client = &mut self.clients[id as usize];
        client.stopped_until = None;
        if let Some(child) = &client.child {
            signals::send(child.id(), signals::SIGCONT)?;
        }
        if let Some(window) = client.window.take() {
            self.windows[window].end = Some(protocol::unix_nanos());
        }
        Ok(())
    }

    /// Cut client `id` off (both ways) until `until`, or for good (`None`: until the run ends).
    fn partition(&mut self, id: u32, until: Option<Instant>) -> Result<()> {
        netns::cut(crate::protocol::client_host(true, id))?;
        let client = &mut self.clients[id as usize];
        client.cut_until = Some(until);
        client.was_cut = true;
        self.partitions += 1;
        if until.is_none() {
            self.partitions_for_good += 1;
        }
        let now = protocol::unix_nanos();
        self.cuts.push((id, client.incarnation, now));
        self.windows.push(Window {
            client: id,
            start: now,
            end: None,
            kill: false,
            partition: true,
        });
        client.window = Some(self.windows.len() - 1);
        Ok(())
    }

    /// End client `id`'s partition.
    fn heal(&mut self, id: u32) -> Result<()> {
        netns::heal(crate::protocol::client_host(true, id))?;
        let client = &mut self.clients[id as usize];
        client.cut_until = None;
        if let Some(window) = client.window.take() {
            self.windows[window].end = Some(protocol::unix_nanos());
        }
        Ok(())
    }

    /// Handle one line of a child's output.
    fn on_line(&mut self, who: Who, line: &str) {
        match who {
            Who::Server => {
                if let Some(port) = line.strip_prefix("listening port=") {
                    self.server_port = port.trim().parse().unwrap_or(0);
                }
            }
            Who::Client { id, incarnation } => {
                let Some(client) = self.clients.get_mut(id as usize) else {
                    return;
                };
                if client.incarnation != incarnation {
                    return;
                }
                if let Some(port) = line.strip_prefix("ready port=") {
                    let port: Option<u16> = port.trim().parse().ok();
                    if client.asked_port.is_some() && port == client.asked_port {
                        self.reused += 1;
                    }
                    client.port = port;
                    client.ready = true;
                    if let Some(window) = client.window.take() {
                        let window = &mut self.windows[window];
                        let at_least = window.start + KILL_WINDOW.as_nanos() as u64;
                        window.end = Some(at_least.max(protocol::unix_nanos() + 250_000_000));
                    }
                }
            }
        }
    }

    /// Reap children that exited on their own: the server is fatal, a client is restarted
    /// (without port reuse when its bind failed) and counted.
    fn reap_unexpected(&mut self) -> Result<()> {
        if let Some(server) = &mut self.server {
            if let Some(status) = server.try_wait()? {
                self.server = None;
                return Err(format!("the server exited during the run: {status}").into());
            }
        }
        for id in 0..self.clients.len() as u32 {
            let client = &mut self.clients[id as usize];
            let Some(child) = &mut client.child else {
                continue;
            };
            if let Some(status) = child.try_wait()? {
                client.child = None;
                let incarnation = client.incarnation + 1;
                let lost =
                    client.was_cut && status.code() == Some(i32::from(protocol::EXIT_LOST_SERVER));
                if lost {
                    // Its connections outlasted tcp's retransmissions: a new incarnation, on a
                    // healed network (as a host that comes back).
                    self.lost_to_partition += 1;
                    if client.cut_until.take().is_some() {
                        netns::heal(protocol::client_host(true, id))?;
                    }
                } else if client.ready || !self.reuse_ports {
                    self.unexpected_exits.push(format!(
                        "client {id} incarnation {} exited on its own: {status}",
                        client.incarnation
                    ));
                }
                // Not ready with --reuse-ports: the old port could not be bound; a fresh one.
                let window = client.window.take();
                self.spawn_client(id, incarnation, None)?;
                self.clients[id as usize].window = window;
            }
        }
        Ok(())
    }
}

/// Wait for `child` to exit within `patience`; `None` if it did not (it is still running).
fn wait_within(child: &mut Child, patience: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(TICK);
    }
}

fn drain_lines(fleet: &mut Fleet, lines: &Receiver<Line>) {
    while let Ok((who, line)) = lines.try_recv() {
        if who == Who::Server && line.starts_with("FLEET-TOTALS ") {
            fleet.totals = Some(line);
        } else if who == Who::Server && line.starts_with("FLEET-DEPARTURE ") {
            fleet.departures.push(line);
        } else if who == Who::Server && line.starts_with("FLEET-ERRORS") {
            fleet.errors = Some(line);
        } else {
            fleet.on_line(who, &line);
        }
    }
}

/// Run the fleet, phase by phase: check the flags (or run the fleet inside a namespace of its
/// own), start the server and the clients, inject faults for `--seconds`, end the faults, stop
/// the clients and then the server, and report; `Ok(false)` when a requirement failed.
pub fn run(flags: &Flags) -> Result<bool> {
    if flags.tcp_retries2.is_some() && !flags.netns {
        return Err(
            "--tcp-retries2 needs --netns: it is set in the fleet's own namespace, never \
                    on the host"
                .into(),
        );
    }
    if (flags.netns || flags.partition_rate > 0.0) && !flags.inside_netns {
        return netns::run_outside(flags);
    }
    if flags.inside_netns {
        // The outer supervisor waits for this one and removes the namespace: die with it.
        signals::die_with_parent(flags.supervisor_pid)?;
    }
    if 0 == flags.clients || flags.seconds.is_nan() || flags.seconds <= 0.0 {
        return Err("--clients and --seconds must be positive".into());
    }
    if flags.kill_rate < 0.0 || flags.stop_rate < 0.0 || flags.partition_rate < 0.0 {
        return Err("rates cannot be negative".into());
    }
    signals::catch_interrupts()?;
    let (mut fleet, lines) = Fleet::new(flags)?;
    start(&mut fleet, &lines, flags.clients)?;
    announce(flags);
    inject_faults(&mut fleet, &lines, flags)?;
    end_faults(&mut fleet, &lines)?;
    let mut ok = stop_clients(&mut fleet)?;
    ok &= stop_server(&mut fleet)?;
    collect_last_lines(&mut fleet, &lines);
    let Some(totals) = fleet.totals.take() else {
        eprintln!("FAIL: the server printed no totals");
        return Ok(false);
    };
    ok &= report::report(flags, &fleet, &totals)?;
    for exit in &fleet.unexpected_exits {
        // Nothing but the supervisor ends a client during the run: one that exits on its own
        // crashed, or its server turned it away.
        eprintln!("FAIL: {exit}");
        ok = false;
    }
    Ok(ok)
}

impl Fleet {
    /// A fleet with nothing started yet, its scratch directory made (after sweeping those of
    /// supervisors that are gone), and the receiving end of its children's output.
    fn new(flags: &Flags) -> Result<(Self, Receiver<Line>)> {
        let supervisor_pid = i32::try_from(std::process::id())?;
        sweep_scratch();
        let scratch = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{supervisor_pid}"));
        std::fs::create_dir_all(&scratch)?;
        let (sender, lines) = mpsc::channel();
        let fleet = Fleet {
            executable: std::env::current_exe()?,
            supervisor_pid,
            scratch,
            server: None,
            server_stdin: None,
            server_port: 0,
            clients: Vec::new(),
            lines: sender,
            windows: Vec::new(),
            reuse_ports: flags.reuse_ports,
            provider: flags.provider,
            write_deadline: flags.write_deadline,
            inside_netns: flags.inside_netns,
            partitions: 0,
            partitions_for_good: 0,
            lost_to_partition: 0,
            started: 0,
            killed: 0,
            stopped: 0,
            reuse_attempts: 0,
            reused: 0,
            unexpected_exits: Vec::new(),
            skipped: 0,
            killed_stopped: 0,
            kills: Vec::new(),
            cuts: Vec::new(),
            shutdown_at: u64::MAX,
            totals: None,
            errors: None,
            departures: Vec::new(),
        };
        Ok((fleet, lines))
    }
}

/// Start the server, then `clients` clients, each announcing itself on stdout, all within
/// [`START_PATIENCE`].
fn start(fleet: &mut Fleet, lines: &Receiver<Line>, clients: u32) -> Result<()> {
    fleet.spawn_server(clients)?;
    let deadline = Instant::now() + START_PATIENCE;
    while 0 == fleet.server_port {
        if signals::interrupted() {
            return Err("interrupted".into());
        }
        match lines.recv_timeout(TICK) {
            Ok((who, line)) => fleet.on_line(who, &line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Err("no output from the server".into()),
        }
        fleet.reap_unexpected()?;
        if Instant::now() >= deadline {
            return Err("the server did not start in time".into());
        }
    }
    for id in 0..clients {
        fleet.spawn_client(id, 0, None)?;
    }
    while !fleet.clients.iter().all(|client| client.ready) {
        if signals::interrupted() {
            return Err("interrupted".into());
        }
        if let Ok((who, line)) = lines.recv_timeout(TICK) {
            fleet.on_line(who, &line);
        }
        fleet.reap_unexpected()?;
        if Instant::now() >= deadline {
            return Err("the clients did not start in time".into());
        }
    }
    Ok(())
}

/// The line that says what runs.
fn announce(flags: &Flags) {
    println!(
        "fleet: server and {} client processes on {}, {}, {} s ({:.1} s without faults first), \
         kill rate {}/s, stop rate {}/s{}{}",
        flags.clients,
        if flags.inside_netns {
            "a network namespace of their own"
        } else {
            "127.0.0.1"
        },
        flags.provider.provider(),
        flags.seconds,
        flags.seconds / 4.0,
        flags.kill_rate,
        flags.stop_rate,
        if flags.reuse_ports {
            ", restarted clients reuse their ports"
        } else {
            ""
        },
        if flags.partition_rate > 0.0 {
            format!(
                ", partition rate {}/s (tcp_retries2 {})",
                flags.partition_rate,
                flags
                    .tcp_retries2
                    .map_or("the kernel's".to_string(), |n| n.to_string())
            )
        } else {
            String::new()
        }
    );
}

/// When each kind of fault is next due: a Poisson process at each rate, from a quarter into
/// the run (the first quarter is the baseline, without faults).
struct Schedule {
    random: Random,
    next_kill: Option<Instant>,
    next_stop: Option<Instant>,
    next_partition: Option<Instant>,
}

impl Schedule {
    /// The first faults, from `faults_from`.
    fn new(flags: &Flags, faults_from: Instant) -> Self {
        let mut random = Random(u64::from(std::process::id()) ^ 0x2545_f491_4f6c_dd1d | 1);
        let next_kill = next_after(&mut random, flags.kill_rate, faults_from);
        let next_stop = next_after(&mut random, flags.stop_rate, faults_from);
        let next_partition = next_after(&mut random, flags.partition_rate, faults_from);
        Self {
            random,
            next_kill,
            next_stop,
            next_partition,
        }
    }
}

/// When a fault at `rate` a second is next due after `from`: an exponential gap (a Poisson
/// process); `None` when the rate is 0.
fn next_after(random: &mut Random, rate: f64, from: Instant) -> Option<Instant> {
    (rate > 0.0).then(|| from + Duration::from_secs_f64(-(1.0 - random.unit()).ln() / rate))
}

/// The run: a quarter without faults (the baseline), then faults at the given rates, until
/// `--seconds` have passed.
fn inject_faults(fleet: &mut Fleet, lines: &Receiver<Line>, flags: &Flags) -> Result<()> {
    let started = Instant::now();
    let run_for = Duration::from_secs_f64(flags.seconds);
    let faults_from = started + run_for / 4;
    let mut schedule = Schedule::new(flags, faults_from);
    let panic_at = crate::panic_injected(crate::Role::Supervisor).then_some(faults_from);
    while started.elapsed() < run_for {
        if signals::interrupted() {
            return Err("interrupted".into());
        }
        if panic_at.is_some_and(|at| at <= Instant::now()) {
            panic!("FLEET_PANIC=supervisor: a panic injected into the supervisor");
        }
        thread::sleep(TICK);
        drain_lines(fleet, lines);
        fleet.reap_unexpected()?;
        let now = Instant::now();
        end_due_faults(fleet, now)?;
        start_due_faults(fleet, &mut schedule, flags, now)?;
    }
    Ok(())
}

/// Resume the clients whose stop is over and heal those whose partition is, at `now`.
fn end_due_faults(fleet: &mut Fleet, now: Instant) -> Result<()> {
    for id in 0..fleet.clients.len() as u32 {
        if fleet.clients[id as usize]
            .stopped_until
            .is_some_and(|until| until <= now)
        {
            fleet.resume(id)?;
        }
        if fleet.clients[id as usize]
            .cut_until
            .is_some_and(|until| until.is_some_and(|until| until <= now))
        {
            fleet.heal(id)?;
        }
    }
    Ok(())
}

/// Start the faults due at `now` (a partition, a SIGKILL, a SIGSTOP, in that order), each on a
/// random eligible client, and schedule the next of each; a fault with no eligible client is
/// skipped and counted.
fn start_due_faults(
    fleet: &mut Fleet,
    schedule: &mut Schedule,
    flags: &Flags,
    now: Instant,
) -> Result<()> {
    let random = &mut schedule.random;
    if schedule.next_partition.is_some_and(|at| at <= now) {
        schedule.next_partition = next_after(random, flags.partition_rate, now);
        match fleet.pick(random, true) {
            Some(id) => {
                // Some last until the run ends; the rest 1-10 s.
                let until = (random.unit() >= flags.partition_for_good)
                    .then(|| now + Duration::from_secs_f64(1.0 + 9.0 * random.unit()));
                fleet.partition(id, until)?;
            }
            None => fleet.skipped += 1,
        }
    }
    if schedule.next_kill.is_some_and(|at| at <= now) {
        schedule.next_kill = next_after(random, flags.kill_rate, now);
        // Any client, stopped or not: a hung process is what gets `kill -9`.
        match fleet.pick(random, false) {
            Some(id) => fleet.kill_and_restart(id)?,
            None => fleet.skipped += 1,
        }
    }
    if schedule.next_stop.is_some_and(|at| at <= now) {
        schedule.next_stop = next_after(random, flags.stop_rate, now);
        match fleet.pick(random, true) {
            Some(id) => {
                let hold = Duration::from_secs_f64(0.5 + 2.5 * random.unit());
                fleet.stop(id, now + hold)?;
            }
            None => fleet.skipped += 1,
        }
    }
    Ok(())
}

/// End the faults: heal the partitions, resume the stopped, let restarts finish (within
/// [`START_PATIENCE`]), and close every fault window still open.
fn end_faults(fleet: &mut Fleet, lines: &Receiver<Line>) -> Result<()> {
    for id in 0..fleet.clients.len() as u32 {
        if fleet.clients[id as usize].stopped_until.is_some() {
            fleet.resume(id)?;
        }
        if fleet.clients[id as usize].cut_until.is_some() {
            fleet.heal(id)?;
        }
    }
    let deadline = Instant::now() + START_PATIENCE;
    while !fleet.clients.iter().all(|client| client.ready) && Instant::now() < deadline {
        if signals::interrupted() {
            return Err("interrupted".into());
        }
        thread::sleep(TICK);
        drain_lines(fleet, lines);
        fleet.reap_unexpected()?;
    }
    let end_of_faults = protocol::unix_nanos();
    fleet.shutdown_at = end_of_faults;
    for window in &mut fleet.windows {
        window.end.get_or_insert(if window.kill {
            window.start + KILL_WINDOW.as_nanos() as u64
        } else {
            end_of_faults
        });
    }
    Ok(())
}

/// Ask every client to leave, and wait for each within [`CLIENT_EXIT_PATIENCE`] in all (one
/// still running then is killed); `Ok(false)` when one failed or hung.
fn stop_clients(fleet: &mut Fleet) -> Result<bool> {
    for client in &mut fleet.clients {
        if let Some(mut stdin) = client.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
    }
    let mut ok = true;
    let mut lost_after_run = 0;
    let deadline = Instant::now() + CLIENT_EXIT_PATIENCE;
    for id in 0..fleet.clients.len() {
        let client = &mut fleet.clients[id];
        let Some(child) = &mut client.child else {
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match wait_within(child, left)? {
            Some(status) if status.success() => {}
            Some(status)
                if client.was_cut
                    && status.code() == Some(i32::from(protocol::EXIT_LOST_SERVER)) =>
            {
                // Departed by the server during a partition, and told so once it healed.
                lost_after_run += 1;
            }
            Some(status) => {
                eprintln!(
                    "FAIL: client {id} incarnation {} exited with {status}",
                    client.incarnation
                );
                ok = false;
            }
            None => {
                eprintln!(
                    "FAIL: client {id} incarnation {} did not exit within {CLIENT_EXIT_PATIENCE:?}: killed",
                    client.incarnation
                );
                let _ = child.kill();
                let _ = child.wait();
                ok = false;
            }
        }
        client.child = None;
    }
    fleet.lost_to_partition += lost_after_run;
    Ok(ok)
}

/// Ask the server to stop, and wait for it within [`SERVER_EXIT_PATIENCE`]; `Ok(false)` when it
/// failed or hung.
fn stop_server(fleet: &mut Fleet) -> Result<bool> {
    if let Some(mut stdin) = fleet.server_stdin.take() {
        let _ = stdin.write_all(b"stop\n");
    }
    let server_status = match &mut fleet.server {
        Some(server) => wait_within(server, SERVER_EXIT_PATIENCE)?,
        None => None,
    };
    match server_status {
        Some(status) if status.success() => Ok(true),
        Some(status) => {
            eprintln!("FAIL: the server exited with {status}");
            Ok(false)
        }
        None => {
            eprintln!(
                "FAIL: the server did not exit within {SERVER_EXIT_PATIENCE:?} (hung): killed"
            );
            Ok(false)
        }
    }
}

/// The output threads end with the children: take what is left, until the server's totals
/// arrive (or 2 s pass).
fn collect_last_lines(fleet: &mut Fleet, lines: &Receiver<Line>) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while fleet.totals.is_none() && Instant::now() < deadline {
        match lines.recv_timeout(TICK) {
            Ok((Who::Server, line)) if line.starts_with("FLEET-TOTALS ") => {
                fleet.totals = Some(line);
            }
            Ok((Who::Server, line)) if line.starts_with("FLEET-DEPARTURE ") => {
                fleet.departures.push(line);
            }
            Ok((Who::Server, line)) if line.starts_with("FLEET-ERRORS") => {
                fleet.errors = Some(line);
            }
            Ok((who, line)) => fleet.on_line(who, &line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}
