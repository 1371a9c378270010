//! Workload (m): what the machine itself costs, to compare the figures of two machines.
//!
//! Two machines of one kind have measured the same build at CPU costs per run three times
//! apart, while a single-threaded queue beside it moved far less. The admin's work on the XXL
//! path is many small steps between threads and processes (HTTP on loopback, tokio's workers,
//! the SQLite writer's thread), so what a machine charges for a system call, a clock read, a
//! wake-up of another thread and a loopback round trip moves its figures more than its
//! arithmetic does. Each figure here is one loop, in the bench's process, and is printed as
//! `machine.*`:
//!
//! - `cpu` and `clocksource`: the processor's name and the kernel's clock (a clock read costs
//!   a system call, not a few nanoseconds, where the clock source cannot be read from user
//!   space);
//! - `loop_ms`: 300 million steps of integer arithmetic on one thread;
//! - `syscall_ns`: one `getpid` (`std::process::id`, a system call on glibc since 2.25);
//! - `clock_ns`: one `Instant::now`;
//! - `thread_wake_us`: a round trip between two threads that each block until woken;
//! - `tcp_round_trip_us`: a byte sent to a thread over loopback TCP and echoed back;
//! - `load_ns_1mib` to `load_ns_256mib`: one load that waits for the one before
//!   (a walk of a random cycle through 1, 4, 16 and 256 MiB): the caches' and the memory's
//!   latency, address translation included, which the integer loop does not see. The admin's steps touch many small objects (futures,
//!   rows, buffers, SQLite's pages), so two machines whose loops run alike can still charge it
//!   differently.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Instant;

/// Prints the machine's figures.
pub fn report() {
    println!("machine.cpu: {}", cpu_name());
    println!("machine.clocksource: {}", clock_source());
    println!("machine.loop_ms: {:.0}", integer_loop() * 1e3);
    println!(
        "machine.syscall_ns: {:.0}",
        per_call(1_000_000, || {
            std::hint::black_box(std::process::id());
        }) * 1e9
    );
    println!(
        "machine.clock_ns: {:.1}",
        per_call(1_000_000, || {
            std::hint::black_box(Instant::now());
        }) * 1e9
    );
    println!("machine.thread_wake_us: {:.2}", thread_round_trip() * 1e6);
    println!("machine.tcp_round_trip_us: {:.2}", tcp_round_trip() * 1e6);
    for mib in [1, 4, 16, 256] {
        println!("machine.load_ns_{mib}mib: {:.1}", dependent_load(mib << 20) * 1e9);
    }
}

fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = info.lines().find_map(|line| line.strip_prefix("model name"));
    let name = name.and_then(|rest| rest.split_once(':')).map(|(_, name)| name.trim());
    name.unwrap_or("unknown").to_owned()
}

fn clock_source() -> String {
    let path = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    std::fs::read_to_string(path).map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// Seconds for 300 million steps of a loop the compiler cannot fold.
fn integer_loop() -> f64 {
    let started = Instant::now();
    let mut x: u64 = 0;
    for i in 0..300_000_000_u64 {
        x = std::hint::black_box(x.wrapping_add(i ^ (x >> 3)));
    }
    std::hint::black_box(x);
    started.elapsed().as_secs_f64()
}

/// Seconds per call of `f`, over `calls` calls.
fn per_call(calls: u32, mut f: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..calls {
        f();
    }
    started.elapsed().as_secs_f64() / f64::from(calls)
}

const ROUND_TRIPS: u32 = 50_000;

/// Seconds per round trip between this thread and another, each blocked in between.
fn thread_round_trip() -> f64 {
    let (to_echo, from_here) = mpsc::sync_channel::<u32>(1);
    let (to_here, from_echo) = mpsc::sync_channel::<u32>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(n) = from_here.recv() {
            to_here.send(n).unwrap();
        }
    });
    let seconds = per_call(ROUND_TRIPS, || {
        to_echo.send(1).unwrap();
        from_echo.recv().unwrap();
    });
    drop(to_echo);
    echo.join().unwrap();
    seconds
}

/// Seconds per one-byte round trip over loopback TCP to an echoing thread.
fn tcp_round_trip() -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        let mut byte = [0_u8];
        while stream.read_exact(&mut byte).is_ok() {
            stream.write_all(&byte).unwrap();
        }
    });
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut byte = [0_u8];
    let seconds = per_call(ROUND_TRIPS, || {
        stream.write_all(&byte).unwrap();
        stream.read_exact(&mut byte).unwrap();
    });
    drop(stream);
    echo.join().unwrap();
    seconds
}

/// Seconds per load of a walk through a random cycle over `bytes` of memory, each load's
/// address read by the one before.
fn dependent_load(bytes: usize) -> f64 {
    let slots = bytes / std::mem::size_of::<usize>();
    // Sattolo's shuffle makes one cycle through every slot; xorshift is random enough here.
    let mut next: Vec<usize> = (0..slots).collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for at in (1..slots).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let other = usize::try_from(state % at as u64).unwrap_or(0);
        next.swap(at, other);
    }
    const LOADS: u32 = 10_000_000;
    let mut at = 0;
    let seconds = per_call(LOADS, || {
        at = std::hint::black_box(next[at]);
    });
    std::hint::black_box(at);
    seconds
}
