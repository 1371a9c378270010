//! Packs: the short logs of a range of run ids, one file a day, each a record
//! `<logId> <bytes>\n` followed by the log's lines.

use super::*;

/// The file name of the pack run `log_id` falls in.
pub(super) fn pack_name(log_id: i64) -> String {
    format!("p{}.pack", log_id.div_euclid(PACK_RUNS))
}

/// The lines of the records of run `log_id` in the pack at `path`, in the order they were
/// written; `None` when it has none. A damaged record (a header that does not parse, a body cut
/// short by a crash of the machine) ends the reading: what came before it is kept.
pub(super) fn read_pack(path: &Path, log_id: i64) -> std::io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut reader = BufReader::new(file);
    let mut found: Option<Vec<u8>> = None;
    let mut header = Vec::new();
    loop {
        header.clear();
        if reader.by_ref().take(64).read_until(b'\n', &mut header)? == 0 {
            break;
        }
        let parsed = std::str::from_utf8(&header).ok().and_then(|text| {
            let (id, len) = text.strip_suffix('\n')?.split_once(' ')?;
            Some((id.parse::<i64>().ok()?, len.parse::<u64>().ok()?))
        });
        let Some((id, len)) = parsed else { break };
        if id == log_id {
            let body = found.get_or_insert_with(Vec::new);
            let start = body.len();
            let read = reader.by_ref().take(len).read_to_end(body)?;
            if read as u64 != len {
                body.truncate(start);
                break;
            }
        } else {
            reader.seek_relative(i64::try_from(len).unwrap_or(i64::MAX))?;
        }
    }
    Ok(found)
}

/// A record of run `log_id` in its pack: `<log id> <length>\n`, then `lines`.
pub(super) fn pack_record(log_id: i64, lines: &[u8]) -> Vec<u8> {
    let mut record = format!("{log_id} {}\n", lines.len()).into_bytes();
    record.extend_from_slice(lines);
    record
}
