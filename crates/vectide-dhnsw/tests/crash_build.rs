//! A new region's FLUSH sites under the crash simulator. The crash kit
//! (`crates/vectide-crashkit/tests/kit.rs`) crashes d-hnsw at every FLUSH of
//! its writes, but a region is built once per index (or per move), so its
//! rounds meet the build's sites once. Here an index is built over a memory
//! node inside this process on a backing file, on the simulator's media,
//! and crashed right after its first insert returned, many times: every
//! post-crash image (the lines not yet durable kept, dropped or torn)
//! attaches with all its rows. With either build site switched off, some
//! image does not.

use std::sync::Arc;
use vectide_core::params::params_of;
use vectide_core::{Metric, ParamValue, VectorIndex};
use vectide_dhnsw::{sites, DHnsw};
use vectide_remote::{LocalMemory, NetModel, Regions};
use vectide_storage::{install_media_override, PersistMode, SimConfig, SimMedia, Site};

const DIM: usize = 4;
const ROWS: u64 = 60;

fn rows() -> (Vec<u64>, Vec<f32>) {
    let ids: Vec<u64> = (0..ROWS).collect();
    let v = ids
        .iter()
        .flat_map(|&i| {
            let x = i as f32;
            [x, (x * 0.7).sin(), (x * 1.3).cos(), 1.0 / (1.0 + x)]
        })
        .collect();
    (ids, v)
}

/// Builds an index, crashes right after, and attaches to the image:
/// `Ok` when it holds every row, else what went wrong.
fn trial(seed: u64, disabled: Option<Site>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.vtb");
    let media = Arc::new(SimMedia::new(SimConfig {
        seed,
        ..Default::default()
    }));
    media.disable(disabled);
    let image = {
        let _sim = install_media_override(dir.path(), media.clone());
        let regions = Arc::new(Regions::on_file(&file, 1 << 30, PersistMode::Msync).unwrap());
        let mem = Arc::new(LocalMemory::local(regions, NetModel::default()));
        let params = params_of([
            ("region", ParamValue::Str("b".into())),
            ("partitions", ParamValue::Int(3)),
            ("threads", ParamValue::Int(1)),
        ]);
        let idx = DHnsw::over(DIM, Metric::L2, &params, mem).unwrap();
        let (ids, v) = rows();
        idx.insert(1, &ids, &v).unwrap();
        media.image_now()
    };
    let after = tempfile::tempdir().unwrap();
    image.write_to(after.path()).unwrap();
    let path = after.path().join("node.vtb");
    let idx = (vectide_dhnsw::DESCRIPTOR.create)(
        DIM,
        Metric::L2,
        &params_of([
            (
                "memnode",
                ParamValue::Str(format!("file:{}", path.display())),
            ),
            ("region", ParamValue::Str("b".into())),
            ("threads", ParamValue::Int(1)),
        ]),
    )
    .map_err(|e| e.to_string())?;
    if idx.len() != ROWS as usize {
        return Err(format!("{} rows of {ROWS}", idx.len()));
    }
    let (ids, v) = rows();
    for (&id, x) in ids.iter().zip(v.chunks(DIM)) {
        match idx.get(id).map_err(|e| e.to_string())? {
            Some(got) if got == x => {}
            other => return Err(format!("row {id}: {other:?}")),
        }
    }
    Ok(())
}

fn failures(disabled: Option<Site>) -> Vec<String> {
    (0..24)
        .filter_map(|seed| trial(seed, disabled).err())
        .collect()
}

#[test]
fn a_region_built_then_crashed_attaches_whole() {
    let bad = failures(None);
    assert!(bad.is_empty(), "{bad:?}");
}

#[test]
fn mutation_check_of_the_build_sites() {
    for site in [sites::BUILD, sites::BUILD_HEADER] {
        let bad = failures(Some(site));
        assert!(!bad.is_empty(), "switching {} off went unnoticed", site.0);
        println!(
            "{}: {} of 24 images broken, e.g. {}",
            site.0,
            bad.len(),
            bad[0]
        );
    }
}
