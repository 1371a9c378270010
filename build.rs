//! Tells cargo to rebuild the crate when `migrations/` changes: `sqlx::migrate!` embeds the
//! migration files at compile time, and cargo would otherwise not notice a new one.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
