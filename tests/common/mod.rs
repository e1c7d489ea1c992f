//! Helpers shared by the integration tests: the workspace's `testkit`, plus what only these need.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking
#![allow(dead_code, unused_imports)] // each test binary uses some of these

pub use testkit::{Random, efa, in_child_process, sockaddr, tcp, tcp_with_capacity};
