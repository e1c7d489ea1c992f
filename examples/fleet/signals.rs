//! The few signal calls the fleet needs, declared by hand (Linux, glibc) rather than through a
//! new dependency.

use std::sync::atomic::{AtomicBool, Ordering};

/// `SIGINT`.
const SIGINT: i32 = 2;
/// `SIGKILL`.
const SIGKILL: i32 = 9;
/// `SIGTERM`.
pub const SIGTERM: i32 = 15;
/// `SIGCONT` (Linux on x86, arm and most others; not alpha, mips or sparc).
pub const SIGCONT: i32 = 18;
/// `SIGSTOP` (as `SIGCONT`).
pub const SIGSTOP: i32 = 19;
/// `prctl`'s `PR_SET_PDEATHSIG`.
const PR_SET_PDEATHSIG: i32 = 1;

unsafe extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn prctl(option: i32, ...) -> i32;
    fn getppid() -> i32;
}

/// Set by SIGINT or SIGTERM.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: i32) {
    // An atomic store is async-signal-safe: nothing else happens here.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Route SIGINT and SIGTERM to a flag ([`interrupted`]) instead of ending the process.
pub fn catch_interrupts() -> crate::Result<()> {
    for signum in [SIGINT, SIGTERM] {
        // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe; glibc's
        // `signal` installs it with BSD semantics (restarting system calls), and nothing else in
        // this process installs handlers for these signals.
        let previous = unsafe { signal(signum, on_signal) };
        if previous == usize::MAX {
            return Err(format!("signal({signum}) failed").into());
        }
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived since [`catch_interrupts`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Send `signal` to the child `pid`. The caller guarantees that `pid` is a child it has not
/// reaped yet (so the pid cannot have been reused by another process).
pub fn send(pid: u32, signal: i32) -> crate::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: kill(2) takes plain integers and touches no memory of this process.
    let code = unsafe { kill(pid, signal) };
    if code != 0 {
        return Err(format!("kill({pid}, {signal}): {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

/// In a child: die with SIGKILL when the supervisor (the thread that spawned this process)
/// dies, and exit at once if it already has (its pid is not `supervisor`). SIGKILL reaches a
/// stopped process too.
pub fn die_with_parent(supervisor: i32) -> crate::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG, sig) reads its integer arguments only; the variadic
    // arguments are passed as the C `unsigned long` it reads.
    let code = unsafe { prctl(PR_SET_PDEATHSIG, SIGKILL as std::ffi::c_ulong) };
    if code != 0 {
        return Err(format!("prctl: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: getppid(2) takes no arguments and cannot fail.
    let parent = unsafe { getppid() };
    if supervisor != 0 && parent != supervisor {
        return Err(format!("the supervisor ({supervisor}) is gone (parent {parent})").into());
    }
    Ok(())
}
