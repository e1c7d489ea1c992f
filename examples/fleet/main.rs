//! The fleet: a server process and client processes that are killed, stopped and restarted.
//!
//! One binary, three roles (`--role`):
//!
//! - **supervisor** (the default): spawns the server and `--clients` client processes (this same
//!   executable), injects faults at the given rates (`--kill-rate`: SIGKILL a random client, then
//!   start a new incarnation of it; `--stop-rate`: SIGSTOP a random client for 0.5–3 s, then
//!   SIGCONT), stops everything in order, and prints the report. It never tells the server about
//!   a fault: the server learns of a departed client only as a real server would.
//! - **server**: one endpoint with RMA; a control listener on 127.0.0.1 where clients announce
//!   themselves (client id, incarnation, fabric address, `RemoteRegion`); two posting threads that
//!   `fi_write` checksummed records (client, incarnation, sequence, checksum) into random clients
//!   through the endpoint's `AddressCache`, each against a `Lease`; a completion thread that reaps
//!   the completions (which drops the leases). A client departs when its control connection
//!   closes or a write to it completes with an error: then, and only then, the server calls
//!   `release` for it.
//! - **client**: its own endpoint, a registered ring of record slots, a control connection to the
//!   server; it checks every record that lands (misdirected: for another client or incarnation;
//!   corrupt: a bad checksum that stays bad) and reports its counts over the control connection,
//!   periodically and before a clean exit.
//!
//! With `--netns` (root only) the supervisor first creates a network namespace of its own and
//! runs the fleet inside it (`supervisor/netns.rs`): each client on an address of its own there,
//! so that `--partition-rate` can cut one client off, both ways, with an nftables rule, for 1–10 s
//! or for good; `--tcp-retries2` sets how long tcp retransmits to a peer that does not answer. The
//! server departs a client whose oldest write has been in flight for `--write-deadline` seconds
//! (`LibfabricEndpoint::overdue_operations`). `--provider tcp-native` runs libfabric 2.x's native
//! tcp instead of tcp;ofi_rxm. `docs/faults.md` has what these runs measured.
//!
//! Every process stays on 127.0.0.0/8. Children die with the supervisor (`PR_SET_PDEATHSIG`,
//! and a closed stdin asks them to stop), and the supervisor kills and reaps every child on every
//! exit path: normal exit, error, panic (a drop guard) and Ctrl-C (a SIGINT handler that sets a
//! flag; the children run in process groups of their own, so the terminal's SIGINT reaches only
//! the supervisor). The namespace is removed on the same paths by the supervisor that created it,
//! and one left by a supervisor killed with SIGKILL by the next run.

mod client;
mod protocol;
mod server;
mod signals;
mod supervisor;

/// A test hook: `FLEET_PANIC=supervisor` or `FLEET_PANIC=server` makes that process panic a
/// few seconds into the run, to check that every process is cleaned up after a panic.
pub fn panic_injected(role: Role) -> bool {
    std::env::var("FLEET_PANIC").is_ok_and(|wanted| {
        wanted.eq_ignore_ascii_case(match role {
            Role::Supervisor => "supervisor",
            Role::Server => "server",
            Role::Client => "client",
        })
    })
}

use std::error::Error;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use dma_libfabric::Configuration;

/// The error type of every role.
pub type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// The providers the fleet runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FleetProvider {
    /// `tcp;ofi_rxm`.
    Tcp,
    /// libfabric 2.x's native `tcp` RDM endpoint.
    TcpNative,
}

impl FleetProvider {
    /// The crate's provider.
    pub fn provider(self) -> dma_libfabric::Provider {
        match self {
            Self::Tcp => dma_libfabric::Provider::Tcp,
            Self::TcpNative => dma_libfabric::Provider::TcpNative,
        }
    }

    /// The command-line spelling.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::TcpNative => "tcp-native",
        }
    }
}

/// Which process this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Spawns the server and the clients, injects faults, prints the report.
    Supervisor,
    /// The data-transfer server.
    Server,
    /// One client process.
    Client,
}

/// Command-line flags (the supervisor's are the public ones; the rest it passes to its children).
#[derive(Debug, Clone, Parser)]
#[command(
    about = "A server and client processes that are killed, stopped and restarted",
    args_override_self = true
)]
pub struct Flags {
    /// Which process this is.
    #[arg(long, value_enum, default_value_t = Role::Supervisor)]
    pub role: Role,
    /// How long the traffic runs, in seconds (the first quarter without faults: the baseline).
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Client processes.
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// SIGKILLs a second (each followed by a new incarnation of that client).
    #[arg(long, default_value_t = 1.0)]
    pub kill_rate: f64,
    /// SIGSTOPs a second (each for a random 0.5–3 s, then SIGCONT).
    #[arg(long, default_value_t = 1.0)]
    pub stop_rate: f64,
    /// A restarted client binds its predecessor's port when it can (tcp's
    /// `FI_TCP_PORT_LOW_RANGE`/`HIGH_RANGE`), so the new process has the old one's address.
    #[arg(long)]
    pub reuse_ports: bool,
    /// The provider: `tcp` (tcp;ofi_rxm, every libfabric) or `tcp-native` (libfabric 2.x's
    /// native tcp reliable-datagram endpoint).
    #[arg(long, value_enum, default_value_t = FleetProvider::Tcp)]
    pub provider: FleetProvider,
    /// Run the fleet in a network namespace of its own (root only): a fresh loopback, each
    /// client on an address of its own in 127.0.0.0/8, removed on every exit path.
    #[arg(long)]
    pub netns: bool,
    /// Partitions a second (needs --netns): an nftables rule drops one client's packets both
    /// ways for a random 1–10 s, or (`--partition-for-good` of them) for the rest of the run.
    #[arg(long, default_value_t = 0.0)]
    pub partition_rate: f64,
    /// Server: a client with a write in flight for this many seconds has stopped answering: the
    /// server departs it (stops writing, releases its entry, closes its control connection) and
    /// its entry goes once the provider completes what is in flight. 0 turns it off. Well above
    /// the longest SIGSTOP (3 s), so a stopped client keeps its transfers even when a stop and a
    /// partition follow each other.
    #[arg(long, default_value_t = 10.0)]
    pub write_deadline: f64,
    /// The share of partitions that last until the run ends (the rest last 1–10 s).
    #[arg(long, default_value_t = 0.2)]
    pub partition_for_good: f64,
    /// With --netns: set the namespace's `net.ipv4.tcp_retries2` (how many times tcp retransmits
    /// unacknowledged data before it gives the connection up; the kernel's default is 15, about
    /// 15 minutes on loopback; 5 is about 12.6 s). Without it the kernel's value stays.
    #[arg(long)]
    pub tcp_retries2: Option<u32>,
    /// Supervisor: already inside the namespace `--netns` created (set by the outer supervisor).
    #[arg(long, hide = true)]
    pub inside_netns: bool,
    /// Client and server: the supervisor's pid (a child exits if its parent is not it).
    #[arg(long, hide = true, default_value_t = 0)]
    pub supervisor_pid: i32,
    /// Client: its id.
    #[arg(long, hide = true, default_value_t = 0)]
    pub id: u32,
    /// Client: its incarnation.
    #[arg(long, hide = true, default_value_t = 0)]
    pub incarnation: u32,
    /// Client: the server's control port on 127.0.0.1.
    #[arg(long, hide = true, default_value_t = 0)]
    pub server_port: u16,
    /// Server: where to write the post-to-completion samples.
    #[arg(long, hide = true)]
    pub samples: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    // rxm reads its buffer sizes from the environment once, when libfabric initialises.
    // SAFETY: nothing else runs yet (no thread has been spawned and libfabric has not been
    // initialised), so no one reads the environment concurrently.
    if let Err(error) = unsafe { Configuration::default().apply_rxm_environment() } {
        eprintln!("fleet: {error}");
        return ExitCode::FAILURE;
    }
    let flags = Flags::parse();
    if flags.role != Role::Supervisor {
        // A child with a dead thread is broken: a panic anywhere ends the whole process, so the
        // supervisor sees it (and the server's control connections close, as on a crash).
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
    }
    let outcome = match flags.role {
        Role::Supervisor => supervisor::run(&flags),
        Role::Server => server::run(&flags).map(|()| true),
        Role::Client => client::run(&flags).map(|()| true),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("fleet {:?}: {error}", flags.role);
            if signals::interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
