//! A client process: its own endpoint, a ring of record slots, a control connection.

use std::io::{BufRead, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, LibfabricEndpoint, MemoryRegion};

use crate::protocol::{self, CLIENT_SLOTS, Counts, Framer, Message, Polled, RECORD_LEN};
use crate::{Flags, Result, signals};

/// How long a client tries to reach the server's control port.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);
/// How often a client reports its counts.
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How long a record with a bad checksum may stay unchanged before it counts as corrupt (a
/// write still landing completes within the client's next progress calls).
const TORN_PATIENCE: Duration = Duration::from_millis(200);
/// How long a leaving client waits for the server's `Drained`.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);
/// How long it keeps progressing after `Drained`, for bytes still in its socket.
const SETTLE: Duration = Duration::from_millis(100);

/// What a client knows about one slot whose checksum was bad when read.
#[derive(Clone, Copy)]
struct Suspect {
    bytes: [u8; RECORD_LEN],
    since: Instant,
}

/// The client's checking state.
struct Checker<'a> {
    id: u64,
    incarnation: u64,
    memory: &'a MemoryRegion<'a>,
    counts: Counts,
    suspects: [Option<Suspect>; CLIENT_SLOTS],
}

impl Checker<'_> {
    /// Check every slot; `last` counts every bad checksum as corrupt. Returns records read.
    fn check(&mut self, last: bool) -> Result<u64> {
        let mut found = 0;
        let mut record = [0_u8; RECORD_LEN];
        for slot in 0..CLIENT_SLOTS {
            let at = slot * RECORD_LEN;
            self.memory.read_bytes(at, &mut record)?;
            if record == [0; RECORD_LEN] {
                self.suspects[slot] = None;
                continue;
            }
            let Some((client, incarnation, sequence)) = protocol::decode_record(&record) else {
                let now = Instant::now();
                let suspect = self.suspects[slot].get_or_insert(Suspect {
                    bytes: record,
                    since: now,
                });
                if suspect.bytes != record {
                    *suspect = Suspect {
                        bytes: record,
                        since: now,
                    };
                } else if last || now.duration_since(suspect.since) >= TORN_PATIENCE {
                    self.counts.corrupt += 1;
                    eprintln!(
                        "CORRUPT: client {} incarnation {} slot {slot}: {record:02x?}",
                        self.id, self.incarnation
                    );
                    self.suspects[slot] = None;
                    self.memory.write_bytes(at, &[0; RECORD_LEN])?;
                }
                continue;
            };
            self.suspects[slot] = None;
            found += 1;
            self.counts.checked += 1;
            if client != self.id || incarnation != self.incarnation {
                self.counts.misdirected += 1;
                eprintln!(
                    "MISDIRECTED: client {} incarnation {} holds record {sequence} for client {client} incarnation {incarnation}",
                    self.id, self.incarnation
                );
            }
            self.memory.write_bytes(at, &[0; RECORD_LEN])?;
        }
        Ok(found)
    }
}

/// The control connection failed during the run. Inside the fleet's namespace that is a
/// partition outlasting tcp's retransmissions: the process exits with
/// [`protocol::EXIT_LOST_SERVER`] so that the supervisor starts a new incarnation; elsewhere it
/// is an error.
fn lost_server(flags: &Flags, why: &str) -> Box<dyn std::error::Error + Send + Sync> {
    if flags.inside_netns {
        eprintln!(
            "fleet client {} incarnation {}: lost the server ({why}): exiting for a new incarnation",
            flags.id, flags.incarnation
        );
        std::process::exit(i32::from(protocol::EXIT_LOST_SERVER));
    }
    format!("the server went away: {why}").into()
}

/// Run one client process until asked to stop (a `stop` line or EOF on stdin, or SIGTERM).
pub fn run(flags: &Flags) -> Result<()> {
    signals::die_with_parent(flags.supervisor_pid)?;
    signals::catch_interrupts()?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        thread::Builder::new().name("stdin".into()).spawn(move || {
            // A `stop` line, or EOF (the supervisor went away), asks for a clean exit.
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(line) if line.trim() == "stop" => break,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            stop.store(true, Ordering::SeqCst);
        })?;
    }

    let host = protocol::client_host(flags.inside_netns, flags.id);
    let configuration = Configuration {
        rma: true,
        providers: vec![flags.provider.provider()],
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some(&host.to_string()))?;
    let address = endpoint.local_address()?;
    let memory = endpoint.register(CLIENT_SLOTS * RECORD_LEN)?;

    // In the fleet's namespace the server listens on every address of its loopback, and the
    // client connects to its own: the kernel then sends from that address too, so a partition
    // of it cuts the control connection as well.
    let server = SocketAddrV4::new(host, flags.server_port);
    let deadline = Instant::now() + CONNECT_PATIENCE;
    let mut control = loop {
        match TcpStream::connect_timeout(&server.into(), Duration::from_secs(1)) {
            Ok(stream) => break stream,
            Err(error) if Instant::now() >= deadline => {
                return Err(format!("connecting to the server at {server}: {error}").into());
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    };
    control.set_nodelay(true)?;
    control.set_nonblocking(true)?;
    protocol::send(
        &mut control,
        &Message::Hello {
            id: flags.id,
            incarnation: flags.incarnation,
            address: address.clone(),
            region: memory.remote().to_bytes(),
        },
    )?;
    // tcp's address is a sockaddr_in: the port is bytes 2..4, big endian.
    let port = address
        .get(2..4)
        .map_or(0, |port| u16::from_be_bytes([port[0], port[1]]));
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "ready port={port}")?;
        stdout.flush()?;
    }

    let mut checker = Checker {
        id: u64::from(flags.id),
        incarnation: u64::from(flags.incarnation),
        memory: &memory,
        counts: Counts::default(),
        suspects: [None; CLIENT_SLOTS],
    };
    let mut framer = Framer::default();
    let mut last_report = Instant::now();
    let mut idle_rounds = 0_u32;
    while !stop.load(Ordering::SeqCst) && !signals::interrupted() {
        endpoint.progress();
        if 0 == checker.check(false)? {
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds > 8 {
                // Pacing, not synchronisation: an idle client gives its core back.
                thread::sleep(Duration::from_micros(200));
            }
        } else {
            idle_rounds = 0;
        }
        if last_report.elapsed() >= REPORT_EVERY {
            last_report = Instant::now();
            if let Err(error) = protocol::send(&mut control, &Message::Counts(checker.counts)) {
                return Err(lost_server(flags, &error.to_string()));
            }
            match framer.poll(&mut control) {
                Polled::Closed(why) => return Err(lost_server(flags, &why)),
                Polled::Message(message) => {
                    return Err(format!("unexpected {message:?} from the server").into());
                }
                Polled::Nothing => {}
            }
        }
    }

    // A clean exit. Inside the fleet's namespace a control connection that fails now is one the
    // server closed while this client was cut off: it lost the server, as during the run.
    if let Err(error) = leave(flags, &endpoint, &mut checker, &mut framer, &mut control) {
        return Err(lost_server(flags, &error.to_string()));
    }
    drop(memory);
    drop(endpoint);
    Ok(())
}

/// Say `Leaving`, wait for `Drained`, check once more, send the last report, wait for the server
/// to close.
fn leave(
    flags: &Flags,
    endpoint: &LibfabricEndpoint,
    checker: &mut Checker<'_>,
    framer: &mut Framer,
    control: &mut TcpStream,
) -> Result<()> {
    // A clean exit: the server stops writing, drains, says so; then the last check and report.
    protocol::send(control, &Message::Leaving)?;
    let deadline = Instant::now() + DRAIN_PATIENCE;
    let mut drained = false;
    while Instant::now() < deadline {
        endpoint.progress();
        checker.check(false)?;
        match framer.poll(control) {
            Polled::Message(Message::Drained) => {
                drained = true;
                break;
            }
            Polled::Message(message) => {
                return Err(format!("unexpected {message:?} from the server").into());
            }
            Polled::Closed(why) => return Err(format!("the server went away: {why}").into()),
            Polled::Nothing => thread::sleep(Duration::from_micros(200)),
        }
    }
    let settle = Instant::now() + SETTLE;
    while Instant::now() < settle {
        endpoint.progress();
        checker.check(false)?;
        thread::sleep(Duration::from_micros(200));
    }
    checker.check(true)?;
    checker.counts.last = true;
    control.set_nonblocking(false)?;
    protocol::send(control, &Message::Counts(checker.counts))?;
    control.shutdown(std::net::Shutdown::Write)?;
    if !drained {
        eprintln!(
            "fleet client {} incarnation {}: the server did not say Drained within {DRAIN_PATIENCE:?}",
            flags.id, flags.incarnation
        );
    }
    // The server closes once it has the report; bounded.
    control.set_read_timeout(Some(Duration::from_secs(2)))?;
    let _ = std::io::copy(control, &mut std::io::sink());
    Ok(())
}
