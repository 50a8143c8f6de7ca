//! `sqlx::migrate!` embeds the migrations at compile time, but on stable
//! Rust cargo does not know it reads them: without this, a new migration
//! file would not rebuild the server.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
