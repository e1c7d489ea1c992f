//! The churn demo's report: the table whose rows scripts read (`scripts/bench-table` reads
//! `resolve p50 / p99, miss`), and the verdict that decides the exit status.

use std::sync::atomic::Ordering;

use dma_libfabric::{Description, RailSet};

use super::{End, Flags, Result, Summary, World};

/// One row of the report: the figure's name, which scripts grep for, and its value.
type Row = (&'static str, String);

/// The report's rows: the message rows, or with `--rma` the RMA rows instead of the message
/// counts (and with `--rails` the rail rows, one rail resolve latency instead of hits and
/// misses).
pub(super) fn report(
    flags: &Flags,
    world: &World,
    description: &Description,
    summary: &Summary,
) -> Result<Vec<Row>> {
    let mut rows = message_rows(flags, world, description, summary);
    if flags.rma {
        // These count messages, which --rma does not send.
        rows.retain(|(name, _)| {
            ![
                "messages sent",
                "messages/s",
                "messages received",
                "misdirected",
                "lost to departed clients",
                "undelivered to live clients",
                "undeliverable sends (peer gone or busy)",
                "receive error completions",
            ]
            .contains(name)
        });
        rows.splice(4..4, rma_rows(flags, world, summary)?);
        if let Some(rails) = &world.rail_server {
            rows.splice(4..4, rail_rows(world, rails));
            // A rail resolve is not told apart as a hit or a miss: its latency is one row.
            rows.retain(|(name, _)| {
                !["hit rate", "hits / misses", "resolve p50 / p99, miss"].contains(name)
            });
            for (name, _) in &mut rows {
                if *name == "resolve p50 / p99, hit" {
                    *name = "rail resolve + lease p50 / p99";
                }
            }
        }
    }
    Ok(rows)
}

/// The rows of every run: the messages, the resolves and the cache.
fn message_rows(
    flags: &Flags,
    world: &World,
    description: &Description,
    summary: &Summary,
) -> Vec<Row> {
    let Summary {
        elapsed,
        samples,
        sent,
        hits,
        misses,
        undeliverable,
        resolve_errors,
        received,
        misdirected,
        lost_departed,
        undelivered_live,
        end: End { stats, indexed },
        ..
    } = summary;
    vec![
        ("provider", description.provider.clone()),
        (
            "clients / posting threads",
            format!("{} / {}", flags.clients, flags.threads),
        ),
        ("run time", format!("{:.1} s", elapsed.as_secs_f64())),
        (
            "client restarts",
            world.restarts.load(Ordering::Relaxed).to_string(),
        ),
        ("messages sent", sent.to_string()),
        (
            "messages/s",
            format!("{:.0}", *sent as f64 / elapsed.as_secs_f64()),
        ),
        ("messages received", received.to_string()),
        ("misdirected", misdirected.to_string()),
        ("lost to departed clients", lost_departed.to_string()),
        ("undelivered to live clients", undelivered_live.to_string()),
        (
            "undeliverable sends (peer gone or busy)",
            undeliverable.to_string(),
        ),
        ("resolve errors", resolve_errors.to_string()),
        (
            "receive error completions",
            world.receive_errors.load(Ordering::Relaxed).to_string(),
        ),
        (
            "hit rate",
            format!(
                "{:.3}%",
                100.0 * *hits as f64 / (hits + misses).max(1) as f64
            ),
        ),
        ("hits / misses", format!("{hits} / {misses}")),
        (
            "resolve p50 / p99, hit",
            format!(
                "{} / {}",
                percentile(&samples.hits, 0.5),
                percentile(&samples.hits, 0.99)
            ),
        ),
        (
            "resolve p50 / p99, miss",
            format!(
                "{} / {}",
                percentile(&samples.misses, 0.5),
                percentile(&samples.misses, 0.99)
            ),
        ),
        ("cache misses (writer requests)", stats.misses.to_string()),
        (
            "fi_av_insert / fi_av_remove",
            format!("{} / {}", stats.inserts, stats.removes),
        ),
        ("evictions", stats.evictions.to_string()),
        ("AV entries left after shutdown", stats.entries.to_string()),
        (
            "pending removals after shutdown",
            stats.pending_removals.to_string(),
        ),
        ("index registrations after shutdown", indexed.to_string()),
    ]
}

/// The rows of an `--rma` run: the writes, and what the leases held back.
fn rma_rows(flags: &Flags, world: &World, summary: &Summary) -> Result<Vec<Row>> {
    let records: u64 = world
        .departed
        .lock()
        .map_err(|_| "poisoned")?
        .iter()
        .map(|traffic| traffic.records.load(Ordering::Relaxed))
        .sum();
    Ok(vec![
        (
            "leases",
            if flags.no_leases {
                "no (--no-leases)"
            } else {
                "yes"
            }
            .to_string(),
        ),
        (
            "FI_AV_REMOVE_CLEANUP",
            std::env::var("FI_AV_REMOVE_CLEANUP").unwrap_or_else(|_| "unset".into()),
        ),
        ("bytes per write", flags.write_size.to_string()),
        ("writes posted", summary.writes_posted.to_string()),
        (
            "writes/s",
            format!(
                "{:.0}",
                summary.writes_posted as f64 / summary.elapsed.as_secs_f64()
            ),
        ),
        ("writes completed ok", summary.writes_ok.to_string()),
        (
            "writes completed with error",
            summary.writes_error.to_string(),
        ),
        (
            "  of which cancelled (FI_ECANCELED)",
            world.rma.cancelled.load(Ordering::Relaxed).to_string(),
        ),
        (
            "writes without a completion",
            summary.writes_without_completion.to_string(),
        ),
        ("writes misdirected", summary.writes_misdirected.to_string()),
        ("records checked in client memory", records.to_string()),
        (
            "torn records read (re-read later)",
            world.rma.torn.load(Ordering::Relaxed).to_string(),
        ),
        (
            "writes not posted (peer gone or busy)",
            summary.undeliverable.to_string(),
        ),
        (
            "removals held back by a lease (peak)",
            world
                .rma
                .peak_awaiting_leases
                .load(Ordering::Relaxed)
                .to_string(),
        ),
        (
            "leases left after shutdown",
            summary.end.stats.leases.to_string(),
        ),
    ])
}

/// The rows of an `--rma --rails` run: the rails, the striped writes and what they carried.
fn rail_rows(world: &World, rails: &RailSet) -> Vec<Row> {
    let bytes = rails.bytes_per_rail();
    vec![
        ("rails", rails.len().to_string()),
        ("writes striped", rails.striped_transfers().to_string()),
        (
            "bytes per rail (min / max)",
            format!(
                "{} / {}",
                bytes.iter().min().copied().unwrap_or(0),
                bytes.iter().max().copied().unwrap_or(0)
            ),
        ),
        (
            "striped records torn",
            world.striped_torn.load(Ordering::Relaxed).to_string(),
        ),
        (
            "evictions released on every rail",
            rails.evictions_propagated().to_string(),
        ),
    ]
}

/// Say what failed, on stderr, and what held: whether the run passed.
pub(super) fn verdict(flags: &Flags, world: &World, summary: &Summary) -> bool {
    let mut ok = true;
    let misdirected = summary.misdirected;
    if 0 < misdirected {
        eprintln!("FAIL: {misdirected} messages reached a client they were not meant for");
        ok = false;
    }
    let writes_misdirected = summary.writes_misdirected;
    if 0 < writes_misdirected {
        eprintln!("FAIL: {writes_misdirected} records landed in a client they were not meant for");
        ok = false;
    }
    let striped_torn = world.striped_torn.load(Ordering::Relaxed);
    if 0 < striped_torn {
        eprintln!("FAIL: {striped_torn} striped records landed in two incarnations");
        ok = false;
    }
    let writes_without_completion = summary.writes_without_completion;
    if 0 < writes_without_completion {
        eprintln!("FAIL: {writes_without_completion} writes never completed");
        ok = false;
    }
    if summary.leaked {
        let End { stats, indexed } = &summary.end;
        eprintln!(
            "FAIL: AV entries leaked: {} live, {} pending, {} inserts vs {} removes, {} indexed",
            stats.entries, stats.pending_removals, stats.inserts, stats.removes, indexed
        );
        ok = false;
    }
    if ok && flags.rma {
        println!("ok: no write misdirected, every write completed, no AV entry or lease leaked");
    } else if ok {
        println!("ok: no message misdirected, no AV entry leaked");
    }
    ok
}

/// The `fraction` percentile of `sorted` nanoseconds, as the table shows it (`-` for none).
fn percentile(sorted: &[u64], fraction: f64) -> String {
    if sorted.is_empty() {
        return "-".into();
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    let nanos = sorted[index.min(sorted.len() - 1)];
    if nanos >= 10_000 {
        format!("{:.1} us", nanos as f64 / 1000.0)
    } else {
        format!("{nanos} ns")
    }
}
