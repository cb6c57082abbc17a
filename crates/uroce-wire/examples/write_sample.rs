//! Writes the sample capture that `uroce decode` is demonstrated on:
//! `cargo run -p uroce-wire --example write_sample -- samples/rc-conversation.pcap`.

fn main() -> std::io::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "samples/rc-conversation.pcap".into());
    let file = std::fs::File::create(&path)?;
    uroce_wire::examples::write_sample_pcap(std::io::BufWriter::new(file))?;
    println!("wrote {path}");
    Ok(())
}
