// `sqlx::migrate!` embeds the migrations it finds but does not notice a new file: rebuild
// whenever the directory changes (as sqlx's documentation advises).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
