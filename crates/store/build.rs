//! The embedded migrations are compiled in (`sqlx::migrate!`): a new or changed one must
//! rebuild the crate.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
