//! Following a run's log as it grows: a [`LogFollower`] reads on from the byte offset where it
//! stopped, woken by each write, and [`follow_json_lines`] makes its pages a stream.

use super::*;

/// How long a followed log may stay quiet before its stream sends a page without lines, which
/// tells the reader the connection is alive.
const FOLLOW_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The pages of `follower` as JSON lines (each a [`LogResult`]), the last one with `isEnd`.
/// A page is read only when the previous one was taken, so a slow reader holds one page.
pub fn follow_json_lines(
    follower: LogFollower,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    futures_util::stream::unfold(Some(follower), |follower| async move {
        let mut follower = follower?;
        let page = match follower.next_page(FOLLOW_IDLE).await {
            Ok(page) => page,
            Err(error) => return Some((Err(error), None)),
        };
        let mut line = serde_json::to_vec(&page).unwrap_or_default();
        line.push(b'\n');
        let next = (!page.is_end).then_some(follower);
        Some((Ok(bytes::Bytes::from(line)), next))
    })
}

/// Reads one run's log as it grows; see [`LogStore::follow`].
pub struct LogFollower {
    pub(super) store: LogStore,
    pub(super) log_id: i64,
    pub(super) trigger_time_ms: i64,
    /// The byte offset of line `next_line`.
    pub(super) offset: u64,
    pub(super) next_line: i64,
    pub(super) from_line: i64,
}

impl LogFollower {
    /// The lines written since the last page (at most a page), waiting up to `idle` for one
    /// when there is none yet. A page without lines and not at the end means the run was quiet
    /// for `idle`; `is_end` comes once the run is over and every line was returned.
    pub async fn next_page(&mut self, idle: std::time::Duration) -> std::io::Result<LogResult> {
        let mut waited = false;
        loop {
            // Registered before reading, so a write between the read and the wait still wakes.
            let notify = self.store.notify_of(self.log_id);
            let notified = notify.as_ref().map(|notify| notify.notified());
            tokio::pin!(notified);
            if let Some(notified) = notified.as_mut().as_pin_mut() {
                notified.enable();
            }
            let active = notify.is_some();
            let (store, log_id, trigger_time_ms) =
                (self.store.clone(), self.log_id, self.trigger_time_ms);
            let (offset, next_line, from_line) = (self.offset, self.next_line, self.from_line);
            let read = tokio::task::spawn_blocking(move || {
                let reader = store.reader(log_id, trigger_time_ms, offset)?;
                read_on(reader, offset, next_line, from_line)
            })
            .await
            .map_err(std::io::Error::other)??;
            let first_line = from_line.max(next_line);
            (self.offset, self.next_line) = (read.offset, read.next_line);
            let has_lines = !read.content.is_empty();
            // Not active before the read: every line was written before it, so it saw them all.
            let is_end = !active && !read.more;
            if has_lines || is_end || waited {
                return Ok(LogResult {
                    from_line_num: first_line,
                    to_line_num: read.next_line.max(from_line) - 1,
                    log_content: read.content,
                    is_end,
                });
            }
            if let Some(notified) = notified.as_pin_mut() {
                let _ = tokio::time::timeout(idle, notified).await;
            }
            waited = true;
        }
    }
}

/// What [`read_on`] found.
struct ReadOn {
    content: String,
    offset: u64,
    next_line: i64,
    /// Whether the page filled up before the end of the log.
    more: bool,
}

/// Reads whole lines from `reader`, which starts at byte `offset` (where line `next_line`
/// starts), skipping those before `from_line`, up to a page. A last line without its newline is
/// being written and is left for the next read.
fn read_on(
    reader: Option<Box<dyn BufRead + Send>>,
    offset: u64,
    next_line: i64,
    from_line: i64,
) -> std::io::Result<ReadOn> {
    let mut read = ReadOn { content: String::new(), offset, next_line, more: false };
    let Some(mut reader) = reader else { return Ok(read) };
    let mut lines = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok(read);
        }
        if read.next_line >= from_line {
            if lines >= PAGE_LINES || read.content.len() + line.len() > PAGE_BYTES {
                read.more = true;
                return Ok(read);
            }
            read.content.push_str(&String::from_utf8_lossy(&line));
            lines += 1;
        }
        read.offset += n as u64;
        read.next_line += 1;
    }
}
