//! Opens SPANN-family index directories and prints what their postings
//! hold: `cargo run --release -p vectide-spfresh --example census DIR...`.

fn main() {
    let mut p = vectide_core::Params::new();
    p.insert("threads".into(), vectide_core::ParamValue::Int(2));
    p.insert(
        "rebuild".into(),
        vectide_core::ParamValue::Str("inline".into()),
    );
    for dir in std::env::args().skip(1) {
        match vectide_spfresh::Spfresh::open(std::path::Path::new(&dir), &p)
            .and_then(|idx| idx.census())
        {
            Ok(c) => println!(
                "{dir}: {} postings, {} records, {} current, {} live: {:.3} copies per vector, {:.1} current per posting",
                c.postings,
                c.records,
                c.current,
                c.live,
                c.copies_per_vector(),
                c.current as f64 / c.postings.max(1) as f64
            ),
            Err(e) => println!("{dir}: {e}"),
        }
    }
}
