fn main() {
    eprintln!("kiln: in progress");
}
