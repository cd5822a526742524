fn main() {
    eprintln!("xtask: in progress");
}
