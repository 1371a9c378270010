//! ElasticJob sharding items: which online executor processes which of a job's items.
//!
//! A sharded job splits every fire into `sharding_total_count` items (`0..n`), each with an
//! optional parameter (`0=Beijing,1=Shanghai,2=Guangzhou`), and [`assign`] spreads the items over
//! the executors with the job's [`ShardingStrategy`]. The answers equal ElasticJob's for the same
//! instance list: the executors are sorted as strings first (ElasticJob sorts its instances the
//! same way), and job names are hashed with Java's `String.hashCode`.
//!
//! - `AVERAGE_ALLOCATION`: `n / k` consecutive items per executor in order, then the remaining
//!   `n % k` items one each to the first executors (3 executors, 8 items: `[0,1,6] [2,3,7] [4,5]`).
//! - `ODEVITY_SORT_BY_NAME`: average allocation over the executors in descending order when the
//!   job name's hash is even, ascending when it is odd.
//! - `ROTATE_SERVER_BY_NAME`: average allocation over the executors rotated left by
//!   `|hash| % k` places. Java's `Math.abs` leaves `i32::MIN` negative, and ElasticJob then
//!   indexes out of bounds; here the magnitude is used, so that one name gets an answer.
//! - `CONSISTENT_HASH`: item `i` goes to the executor whose bucket holds
//!   `sum(|c - '0'|) % 100` over the UTF-16 units of the job name followed by the decimal `i`;
//!   the 100 values are cut into `k` equal ranges, so executor `j` takes values from
//!   `ceil(100 j / k)` to before `ceil(100 (j + 1) / k)` (the bucket is `value * k / 100`).
//!
//! It deliberately does not know about runs, retries or the network: the dispatcher turns the
//! assignment into one run per executor that got items.

use std::collections::BTreeMap;

use crate::model::{ShardingItem, ShardingStrategy};

/// The most items a job may be split into.
pub const MAX_SHARDING_TOTAL_COUNT: u32 = 1_000;

/// Why a job's sharding configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardingError {
    /// An entry of the item parameters is not `item=parameter`.
    #[error("`{entry}` is not `item=parameter`, as in 0=Beijing,1=Shanghai")]
    Malformed {
        /// The entry as given.
        entry: String,
    },
    /// An item number is not below the total count.
    #[error("item {item} is out of range: items run from 0 to {}", total.saturating_sub(1))]
    OutOfRange {
        /// The item.
        item: String,
        /// The job's `sharding_total_count`.
        total: u32,
    },
    /// An item is given twice.
    #[error("item {item} has two parameters")]
    Duplicate {
        /// The item.
        item: u32,
    },
}

/// Reads ElasticJob's item parameters (`0=Beijing,1=Shanghai`) for a job of `total` items:
/// entries separated by commas, each an item number and a non-empty parameter around one `=`,
/// both trimmed. An empty text gives no parameters.
pub fn parse_item_parameters(
    text: &str,
    total: u32,
) -> Result<BTreeMap<u32, String>, ShardingError> {
    let mut parameters = BTreeMap::new();
    if text.trim().is_empty() {
        return Ok(parameters);
    }
    for entry in text.split(',') {
        let malformed = || ShardingError::Malformed { entry: entry.trim().to_owned() };
        let (item, parameter) = entry.split_once('=').ok_or_else(malformed)?;
        let (item, parameter) = (item.trim(), parameter.trim());
        if parameter.is_empty() || parameter.contains('=') {
            return Err(malformed());
        }
        let number: u32 = item.parse().map_err(|_| malformed())?;
        if number >= total {
            return Err(ShardingError::OutOfRange { item: item.to_owned(), total });
        }
        if parameters.insert(number, parameter.to_owned()).is_some() {
            return Err(ShardingError::Duplicate { item: number });
        }
    }
    Ok(parameters)
}

/// The items numbered `items`, each with its parameter from `parameters` (empty if none).
pub fn items_with_parameters(
    items: &[u32],
    parameters: &BTreeMap<u32, String>,
) -> Vec<ShardingItem> {
    items
        .iter()
        .map(|item| ShardingItem {
            item: *item,
            parameter: parameters.get(item).cloned().unwrap_or_default(),
        })
        .collect()
}

/// Spreads items `0..total` of job `job_name` over `executors` with `strategy`: every executor,
/// sorted as strings, with its items in increasing order (possibly none). No executors, no
/// assignment.
pub fn assign(
    strategy: ShardingStrategy,
    job_name: &str,
    total: u32,
    executors: &[String],
) -> Vec<(String, Vec<u32>)> {
    let mut sorted: Vec<&String> = executors.iter().collect();
    sorted.sort();
    sorted.dedup();
    if sorted.is_empty() {
        return Vec::new();
    }
    let hash = java_string_hash(job_name);
    let order: Vec<&String> = match strategy {
        ShardingStrategy::AverageAllocation | ShardingStrategy::ConsistentHash => sorted,
        ShardingStrategy::OdevitySortByName if hash % 2 == 0 => sorted.into_iter().rev().collect(),
        ShardingStrategy::OdevitySortByName => sorted,
        ShardingStrategy::RotateServerByName => {
            let offset = (hash.unsigned_abs() as usize) % sorted.len();
            sorted.rotate_left(offset);
            sorted
        }
    };
    let items = match strategy {
        ShardingStrategy::ConsistentHash => by_digit_sum(job_name, total, order.len()),
        _ => average_allocation(total, order.len()),
    };
    let mut assignment: Vec<(String, Vec<u32>)> = order.into_iter().cloned().zip(items).collect();
    assignment.sort_by(|a, b| a.0.cmp(&b.0));
    assignment
}

/// Java's `String.hashCode`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 units, wrapping.
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |hash, unit| hash.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// Items per position: `total / count` consecutive ones each, then one of the remainder to
/// each of the first positions.
fn average_allocation(total: u32, count: usize) -> Vec<Vec<u32>> {
    let count_u32 = u32::try_from(count).unwrap_or(u32::MAX);
    let each = total / count_u32;
    let mut items: Vec<Vec<u32>> =
        (0..count_u32).map(|position| (position * each..(position + 1) * each).collect()).collect();
    for (list, item) in items.iter_mut().zip(each * count_u32..total) {
        list.push(item);
    }
    items
}

/// Items per position by the digit-sum rule of `CONSISTENT_HASH` (see the module doc).
fn by_digit_sum(job_name: &str, total: u32, count: usize) -> Vec<Vec<u32>> {
    let mut items = vec![Vec::new(); count];
    for item in 0..total {
        let key = format!("{job_name}{item}");
        let sum: u64 = key
            .encode_utf16()
            .map(|unit| u64::from((i32::from(unit) - i32::from(b'0')).unsigned_abs()))
            .sum();
        let value = (sum % 100) as usize;
        if let Some(list) = items.get_mut(value * count / 100) {
            list.push(item);
        }
    }
    items
}

#[cfg(test)]
mod tests;
