//! The first open of a process that has one thread applies rxm's sizing itself.
//!
//! rxm reads its buffer sizes (`FI_OFI_RXM_*`) only from the environment, once, when libfabric
//! initialises; its own defaults cost about 68 MiB per endpoint on 1.17. Setting the environment
//! is sound only while no other thread can read it, so the crate does it when the process has one
//! thread, and otherwise leaves it alone and warns. This test is a program of its own
//! (`harness = false`): a test harness runs each test on a thread of its own, and a one-thread
//! process is what it checks. Its second half runs this program again as a child that starts a
//! thread before its first open.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, LibfabricEndpoint};

/// The argument that makes this program the child with a second thread.
const THREADED_CHILD: &str = "--threaded-child";

fn main() {
    if std::env::args().any(|argument| argument == THREADED_CHILD) {
        threaded_child();
        return;
    }
    a_one_thread_process_gets_the_sizing_at_its_first_open();
    a_process_with_two_threads_is_left_alone();
    println!("rxm_sizing_applied: 2 checks passed");
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc").count()
}

fn a_one_thread_process_gets_the_sizing_at_its_first_open() {
    assert_eq!(
        1,
        threads(),
        "this program has one thread until it starts one"
    );
    let configuration = Configuration::default();
    let wanted = configuration.rxm_environment();
    assert!(!wanted.is_empty(), "the default configuration sizes rxm");
    // What the operator set wins, and is left as it is.
    let preset: Vec<(&str, Option<String>)> = wanted
        .iter()
        .map(|(name, _)| (*name, std::env::var(name).ok()))
        .collect();
    let endpoint = LibfabricEndpoint::open(&configuration, None).expect("open");
    for ((name, value), (_, before)) in wanted.iter().zip(&preset) {
        let now = std::env::var(name).ok();
        match before {
            Some(before) => assert_eq!(Some(before), now.as_ref(), "{name}: the operator's value"),
            None => assert_eq!(
                Some(value),
                now.as_ref(),
                "{name} applied at the first open"
            ),
        }
    }
    // Once libfabric has read its variables, applying them again is refused: nothing changes.
    // SAFETY: the call refuses before it touches the environment (libfabric is initialised).
    let again = unsafe { configuration.apply_rxm_environment() };
    assert!(again.is_err(), "{again:?}");
    drop(endpoint);
}

fn a_process_with_two_threads_is_left_alone() {
    let mut child = std::process::Command::new(std::env::current_exe().expect("this program"));
    child.arg(THREADED_CHILD);
    for (name, _) in Configuration::default().rxm_environment() {
        child.env_remove(name);
    }
    let output = child.output().expect("run the child");
    assert!(
        output.status.success(),
        "the child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("left alone"));
}

/// A process that starts a thread before its first open: the crate cannot set the environment
/// soundly, so it sets nothing (and warns).
fn threaded_child() {
    let (started, wait) = std::sync::mpsc::channel::<()>();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        started.send(()).expect("tell main");
        let _ = stopped.recv();
    });
    wait.recv().expect("the thread runs");
    assert!(threads() >= 2);
    let configuration = Configuration::default();
    let endpoint = LibfabricEndpoint::open(&configuration, None).expect("open");
    for (name, _) in configuration.rxm_environment() {
        assert_eq!(
            None,
            std::env::var_os(name),
            "{name} set with another thread running"
        );
    }
    drop(endpoint);
    stop.send(()).expect("stop the thread");
    other.join().expect("the thread");
    println!("left alone");
}
