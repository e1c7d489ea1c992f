//! What the demos share (`examples/churn.rs`, `examples/fleet/`): the checksummed record a server
//! writes into a client's memory, and the report table they print.

/// The length of a record: client, incarnation, sequence and checksum, 8 bytes each.
pub const RECORD_LEN: usize = 32;

/// A record's checksum: never 0, so a zeroed slot never passes.
///
/// ```
/// assert_ne!(0, testkit::demo::checksum(0, 0, 0));
/// ```
pub fn checksum(client: u64, incarnation: u64, sequence: u64) -> u64 {
    let mut x =
        client ^ incarnation.rotate_left(21) ^ sequence.rotate_left(42) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    x | 1
}

/// The record for (client, incarnation, sequence).
///
/// ```
/// use testkit::demo::{decode_record, encode_record};
///
/// assert_eq!(Some((1, 2, 3)), decode_record(&encode_record(1, 2, 3)));
/// let mut torn = encode_record(1, 2, 3);
/// torn[0] ^= 1;
/// assert_eq!(None, decode_record(&torn));
/// ```
pub fn encode_record(client: u64, incarnation: u64, sequence: u64) -> [u8; RECORD_LEN] {
    let mut record = [0_u8; RECORD_LEN];
    record[0..8].copy_from_slice(&client.to_le_bytes());
    record[8..16].copy_from_slice(&incarnation.to_le_bytes());
    record[16..24].copy_from_slice(&sequence.to_le_bytes());
    record[24..32].copy_from_slice(&checksum(client, incarnation, sequence).to_le_bytes());
    record
}

/// (client, incarnation, sequence) of a whole record; `None` when the checksum is bad (a torn,
/// corrupt or zeroed record).
pub fn decode_record(record: &[u8; RECORD_LEN]) -> Option<(u64, u64, u64)> {
    let word = |at: usize| {
        let mut word = [0; 8];
        word.copy_from_slice(&record[at..at + 8]);
        u64::from_le_bytes(word)
    };
    let (client, incarnation, sequence) = (word(0), word(8), word(16));
    (word(24) == checksum(client, incarnation, sequence)).then_some((client, incarnation, sequence))
}

/// Print `rows` as a two-column markdown table, `figure` and `value`, the values right-aligned.
pub fn print_table(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|(_, value)| value.len()).max().unwrap_or(0);
    println!("| {:width$} | {:>value_width$} |", "figure", "value");
    println!(
        "|{}|{}:|",
        "-".repeat(width + 2),
        "-".repeat(value_width + 1)
    );
    for (name, value) in rows {
        println!("| {name:width$} | {value:>value_width$} |");
    }
}
