//! File mappings at registration: a mapped range that extends past its file's end is refused,
//! since touching a page past the end raises `SIGBUS` (what the application must guarantee
//! afterwards is on [`StableBuffer`](crate::endpoint::buffer::StableBuffer), "File mappings").
//!
//! The mapping's files are found in `/proc/self/maps` (each line: the range, permissions, the
//! file offset, the device, the inode, the path), and each file's length through
//! `/proc/self/map_files/START-END`, a link to the very file mapped there (the one the mapping
//! holds, even if its path was since removed or replaced), or else through its path when that
//! still names the same inode. Only regular files are checked: anonymous memory (inode 0) and
//! devices have no end to pass.
//!
//! Cost: one read of `/proc/self/maps` (a line a mapping of the process) and one `stat` a file,
//! at the registration of a `memmap2::MmapMut` only.

use std::os::unix::fs::MetadataExt;

use crate::error::DmaError;

/// One line of `/proc/self/maps` backed by a file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileRange<'maps> {
    start: usize,
    end: usize,
    /// The file offset of `start`.
    offset: u64,
    inode: u64,
    path: &'maps str,
}

/// The file-backed line of `/proc/self/maps`, if `line` is one (inode not 0).
fn parse(line: &str) -> Option<FileRange<'_>> {
    let mut rest = line;
    let mut fields = [""; 5];
    for field in &mut fields {
        rest = rest.trim_start();
        let end = rest.find(' ').unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let [range, _permissions, offset, _device, inode] = fields;
    let (start, end) = range.split_once('-')?;
    let inode = inode.parse().ok()?;
    if 0 == inode {
        return None;
    }
    Some(FileRange {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode,
        path: rest.trim_start(),
    })
}

/// What is known of a mapped file: its length, or that it is not a regular file (no end to
/// check), or nothing (it could not be looked at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    Regular(u64),
    NotRegular,
    Unknown,
}

/// The length of the file mapped at `range`, as the mapping sees it.
fn length_of(range: &FileRange<'_>) -> Length {
    let link = format!("/proc/self/map_files/{:x}-{:x}", range.start, range.end);
    let metadata = std::fs::metadata(link).or_else(|_| {
        std::fs::metadata(range.path).and_then(|metadata| {
            if metadata.ino() == range.inode {
                Ok(metadata)
            } else {
                Err(std::io::Error::other("the path names another file now"))
            }
        })
    });
    match metadata {
        Ok(metadata) if metadata.is_file() => Length::Regular(metadata.len()),
        Ok(_) => Length::NotRegular,
        Err(_) => Length::Unknown,
    }
}

/// Refuse `len` bytes at `start` when any of them is mapped from a regular file past its end.
///
/// # Errors
/// [`DmaError::InvalidArgument`] naming the file, its length and how far the mapping reaches.
pub(in crate::endpoint) fn check_file_backing(start: usize, len: usize) -> Result<(), DmaError> {
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => maps,
        Err(error) => {
            tracing::warn!(%error, "cannot read /proc/self/maps: a file mapping's length is not checked");
            return Ok(());
        }
    };
    check_against(&maps, start, len, length_of)
}

/// [`check_file_backing`] against the text of `/proc/self/maps` and a way to learn a file's
/// length.
fn check_against(
    maps: &str,
    start: usize,
    len: usize,
    length_of: impl Fn(&FileRange<'_>) -> Length,
) -> Result<(), DmaError> {
    let end = start.saturating_add(len);
    for range in maps.lines().filter_map(parse) {
        if range.end <= start || end <= range.start {
            continue;
        }
        // The last registered byte this line maps, as a file offset one past it.
        let reach = range.offset + (end.min(range.end) - range.start) as u64;
        match length_of(&range) {
            Length::Regular(file_len) if reach > file_len => {
                return Err(DmaError::InvalidArgument(format!(
                    "the {len}-byte buffer at {start:#x} maps {} up to byte {reach}, but the file \
                     is {file_len} bytes long: touching a page past its end raises SIGBUS. Map \
                     at most the file's length (or extend the file first, set_len) and register \
                     that",
                    range.path
                )));
            }
            Length::Unknown => {
                tracing::warn!(
                    path = range.path,
                    "cannot stat a mapped file: its length is not checked"
                );
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000004000 rw-s 00002000 08:01 1234                       /data/my file.bin
7f0000004000-7f0000008000 rw-s 00006000 08:01 1234                       /data/my file.bin
7f0000010000-7f0000011000 rw-s 00000000 00:05 9                          /dev/zero (deleted)
";

    #[test]
    fn lines_parse_with_their_path_and_offset() {
        let lines: Vec<_> = MAPS.lines().filter_map(parse).collect();
        assert_eq!(3, lines.len(), "the heap is anonymous");
        assert_eq!(
            FileRange {
                start: 0x7f00_0000_4000,
                end: 0x7f00_0000_8000,
                offset: 0x6000,
                inode: 1234,
                path: "/data/my file.bin",
            },
            lines[1]
        );
    }

    /// A range over two lines of one file is checked to its last byte's file offset.
    #[test]
    fn a_range_past_the_files_end_is_refused_and_one_inside_it_is_not() {
        let file = |len| {
            move |range: &FileRange<'_>| match range.inode {
                1234 => Length::Regular(len),
                _ => Length::NotRegular,
            }
        };
        // 0x2000 + 0x8000 bytes: the second line's last byte is file offset 0x9fff.
        assert!(check_against(MAPS, 0x7f00_0000_0000, 0x8000, file(0xa000)).is_ok());
        let Err(DmaError::InvalidArgument(reason)) =
            check_against(MAPS, 0x7f00_0000_0000, 0x8000, file(0x9fff))
        else {
            panic!("one byte past the end");
        };
        assert!(
            reason.contains("40960") && reason.contains("40959"),
            "{reason}"
        );
        assert!(
            reason.contains("/data/my file.bin") && reason.contains("SIGBUS"),
            "{reason}"
        );
        // Only the first 4 KiB of the first line: file offsets 0x2000..0x3000.
        assert!(check_against(MAPS, 0x7f00_0000_0000, 0x1000, file(0x3000)).is_ok());
        // A device has no end; the heap is not a file.
        assert!(check_against(MAPS, 0x7f00_0001_0000, 0x1000, file(0)).is_ok());
        assert!(check_against(MAPS, 0x55d0_c0a0_0000, 0x1000, file(0)).is_ok());
    }
}
