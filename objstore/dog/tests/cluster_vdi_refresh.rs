//! A VDI handle re-read while it allocates objects (sheepfs refreshes it on every open) keeps
//! every mapping it made: a refresh that read the inode before an allocation landed once put
//! the older map back, and the new object read as a hole (zeros).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use objstore_client::client::Client;
use objstore_client::vdi::Vdi;
use testkit::cluster::{Bins, Cluster};

fn bins() -> Bins {
    Bins::fresh()
}

#[test]
fn refreshes_during_allocating_writes_lose_no_mapping() {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "r", "1G"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let addr = c.addr(0).parse().unwrap();
        let client = Client::connect(&[addr], testkit::auth::client_options())
            .await
            .unwrap();
        let v = Arc::new(Vdi::open(Arc::new(client), "r").await.unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let refreshers: Vec<_> = (0..4)
            .map(|_| {
                let (v, stop) = (v.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        v.refresh().await.unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // 1024 objects allocated, 16 writes at a time, while the handle is refreshed; each
        // holds a byte 1..=255 (never zero, which a hole would read as).
        let objects: Vec<u64> = (0..1024).collect();
        for batch in objects.chunks(16) {
            let writes = batch.iter().map(|&i| {
                let v = v.clone();
                async move {
                    v.write_at(i << 20, Bytes::from(vec![(i % 255) as u8 + 1; 4096]))
                        .await
                        .unwrap()
                }
            });
            futures::future::join_all(writes).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut refreshes = 0;
        for r in refreshers {
            refreshes += r.await.unwrap();
        }
        assert!(refreshes > 0);
        for i in objects {
            assert!(
                v.object(i).is_some(),
                "object {i} lost its mapping ({refreshes} refreshes)"
            );
            let back = v.read_at(i << 20, 4096).await.unwrap();
            assert_eq!(back[..], vec![(i % 255) as u8 + 1; 4096][..], "object {i}");
        }
    });
}
